-- common.lua: helpers shared by the wrk scripts in this folder (loaded by them
-- through dofile, relative to their own path). It reproduces loadgen's
-- deterministic pre-populated key pool (perf/src/keys.rs: stored_key) so that
-- wrk can ask for keys that `loadgen --setup-only` stored.
local M = {}

-- i-th stored key: s = i mod 2147483646 + 1; four times s = s*48271 mod
-- 2147483647, each printed "%08x". Products stay below 2^53: exact in doubles.
function M.stored_key(i)
  local s = (i % 2147483646) + 1
  local parts = {}
  for j = 1, 4 do
    s = (s * 48271) % 2147483647
    parts[j] = string.format("%08x", s)
  end
  return table.concat(parts)
end

-- A fresh random 32-hex-character key (MD5-like).
function M.random_key()
  local p = {}
  for j = 1, 8 do p[j] = string.format("%04x", math.random(0, 65535)) end
  return table.concat(p)
end

function M.env_num(name, default)
  return tonumber(os.getenv(name) or "") or default
end

-- JSON array of n keys drawn at random from the first `stored` stored keys.
function M.stored_keys_json(n, stored)
  local ks = {}
  for j = 1, n do ks[j] = '"' .. M.stored_key(math.random(0, stored - 1)) .. '"' end
  return "[" .. table.concat(ks, ",") .. "]"
end

-- Gives each wrk thread an id (used to seed its PRNG differently).
local next_id = 0
function M.setup(thread)
  next_id = next_id + 1
  thread:set("thread_id", next_id)
end

M.headers = { ["Content-Type"] = "application/json" }

return M
