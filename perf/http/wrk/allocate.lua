-- allocate.lua: wrk driver for POST /keys/batch_allocate on rank 0 with BATCH
-- (default 128) fresh random keys per request, for people who prefer wrk over
-- target/release/loadgen. So that the finite page pool never fills, every
-- allocate answer is followed (on the same wrk thread) by a confirm_write
-- that releases the pages it returned. wrk cannot tell the two apart, so its
-- requests/s and latencies mix allocates and releases about half and half;
-- `loadgen --scenario allocate` times the allocates alone. Run from the repo root:
--   target/release/loadgen --addr 127.0.0.1:18000 --scenario allocate --setup-only
--   wrk -t1 -c32 -d10s -s perf/http/wrk/allocate.lua http://127.0.0.1:18000
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")
setup = common.setup

local batch = 128
local pending = {}
local heads = {}   -- per key slot: '["' .. 24 random hex chars
local parts = {}
local counter = 0

function init(args)
  math.randomseed(3000 + (thread_id or 0))
  batch = common.env_num("BATCH", 128)
  for j = 1, batch do heads[j] = '["' .. common.random_key():sub(1, 24) end
end

function request()
  local rel = table.remove(pending)
  if rel then
    return rel
  end
  -- Fresh keys, cheaply: a random 24-hex prefix per slot plus an 8-hex
  -- request counter (Lua string formatting would otherwise bottleneck wrk).
  counter = counter + 1
  local tail = string.format("%08x", counter % 4294967296) .. '",""]'
  for j = 1, batch do parts[j] = heads[j] .. tail end
  local body = '{"rank":0,"keys":[' .. table.concat(parts, ",") .. ']}'
  return wrk.format("POST", "/keys/batch_allocate", common.headers, body)
end

function response(status, headers, body)
  if status ~= 200 or not body:find('"results"', 1, true) then
    return
  end
  local pages = {}
  -- entries look like ["<key>",<page>]; -1 (nothing reserved) is skipped.
  for p in body:gmatch(',%s*(%d+)%s*%]') do pages[#pages + 1] = p end
  if #pages > 0 then
    local rel = '{"rank":0,"confirmations":[],"pages_to_release":[' .. table.concat(pages, ",") .. ']}'
    pending[#pending + 1] = wrk.format("POST", "/keys/confirm_write", common.headers, rel)
  end
end
