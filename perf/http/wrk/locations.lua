-- locations.lua: wrk driver for POST /keys/get_locations on rank 0, the
-- worker's load path, for people who prefer wrk over target/release/loadgen.
-- Each request asks for BATCH (default 128) of the STORED (default 10000)
-- keys that loadgen pre-populates, so every location is non-null. Run from
-- the repo root:
--   target/release/loadgen --addr 127.0.0.1:18000 --scenario locations --setup-only
--   wrk -t1 -c32 -d10s -s perf/http/wrk/locations.lua http://127.0.0.1:18000
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")
setup = common.setup

local reqs = {}
local n = 0

function init(args)
  math.randomseed(2000 + (thread_id or 0))
  local batch = common.env_num("BATCH", 128)
  local stored = common.env_num("STORED", 10000)
  for i = 1, 256 do
    local body = '{"rank":0,"keys":' .. common.stored_keys_json(batch, stored) .. '}'
    reqs[i] = wrk.format("POST", "/keys/get_locations", common.headers, body)
  end
end

function request()
  n = n % #reqs + 1
  return reqs[n]
end
