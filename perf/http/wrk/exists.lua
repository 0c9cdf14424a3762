-- exists.lua: wrk driver for POST /keys/batch_exists, the scheduler's lookup,
-- for people who prefer wrk over target/release/loadgen. Each request asks
-- for BATCH (default 128) keys drawn from the STORED (default 10000) keys that
-- loadgen pre-populates, so every lookup hits. Run from the repo root:
--   target/release/loadgen --addr 127.0.0.1:18000 --scenario exists --setup-only
--   wrk -t1 -c32 -d10s -s perf/http/wrk/exists.lua http://127.0.0.1:18000
-- (setup: /clear, initialize rank 0 with 1M pages, store the keys; pass the
-- same --stored/--batch to loadgen as STORED/BATCH here if you change them.)
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")
setup = common.setup

local reqs = {}
local n = 0

function init(args)
  math.randomseed(1000 + (thread_id or 0))
  local batch = common.env_num("BATCH", 128)
  local stored = common.env_num("STORED", 10000)
  for i = 1, 256 do
    local body = '{"keys":' .. common.stored_keys_json(batch, stored) .. '}'
    reqs[i] = wrk.format("POST", "/keys/batch_exists", common.headers, body)
  end
end

function request()
  n = n % #reqs + 1
  return reqs[n]
end
