-- wrk script: lock acquire+release pairs against lockstep's lock API.
--
-- Run with as many threads as connections (wrk -tN -cN): each thread then has
-- exactly one connection, so its requests go out strictly one after another
-- and it can alternate
--     POST   /locks/bench:<run>:<thread>   {"owner":"w<thread>","ttl_ms":30000}  -> 200
--     DELETE /locks/bench:<run>:<thread>   Lock-Owner: w<thread>                 -> 204
-- on a resource no other client touches: no acquire ever conflicts.
--
-- <run> comes from $BENCH_RUN and must differ between the warm-up and the
-- measured run: when wrk stops it drops requests still in flight, and the
-- server may complete them later; a DELETE left over from the warm-up would
-- otherwise release a lock the measured run had just taken (a spurious 404).
-- $LOCK_TTL_MS sets ttl_ms (default 30000).
--
-- The phase only advances in response(), so a request lost to a socket error
-- and sent again keeps its place in the alternation. A pair counts when its
-- POST got 200 and its DELETE got 204; every other status is counted and
-- reported by done() on one line that run.sh parses:
--     LOCKS pairs=N post_ok=N post_bad=N del_ok=N del_bad=N statuses=409:3,404:1 seconds=S p99_ms=X

local threads = {}
local next_id = 1

function setup(thread)
   thread:set("id", next_id)
   table.insert(threads, thread)
   next_id = next_id + 1
end

function init()
   local ttl = os.getenv("LOCK_TTL_MS") or "30000"
   resource = "bench:" .. (os.getenv("BENCH_RUN") or "run") .. ":" .. id
   owner = "w" .. id
   acquire_req = wrk.format("POST", "/locks/" .. resource,
      { ["Content-Type"] = "application/json" },
      '{"owner":"' .. owner .. '","ttl_ms":' .. ttl .. '}')
   release_req = wrk.format("DELETE", "/locks/" .. resource,
      { ["Lock-Owner"] = owner }, nil)
   acquiring = true
   acquired = false
   ok_pairs, post_ok, post_bad, del_ok, del_bad = 0, 0, 0, 0, 0
   statuses = {}
end

function request()
   if acquiring then
      return acquire_req
   end
   return release_req
end

local function other(status)
   local key = tostring(status)
   statuses[key] = (statuses[key] or 0) + 1
end

function response(status, headers, body)
   if acquiring then
      if status == 200 then
         post_ok = post_ok + 1
         acquired = true
      else
         post_bad = post_bad + 1
         acquired = false
         other(status)
      end
   else
      if status == 204 then
         del_ok = del_ok + 1
         if acquired then
            ok_pairs = ok_pairs + 1
         end
      else
         del_bad = del_bad + 1
         other(status)
      end
      acquired = false
   end
   acquiring = not acquiring
end

function done(summary, latency, requests)
   local t = { ok_pairs = 0, post_ok = 0, post_bad = 0, del_ok = 0, del_bad = 0 }
   local all = {}
   for _, thread in ipairs(threads) do
      for k, _ in pairs(t) do
         t[k] = t[k] + (thread:get(k) or 0)
      end
      local s = thread:get("statuses") or {}
      for code, n in pairs(s) do
         all[code] = (all[code] or 0) + n
      end
   end
   local list = {}
   for code, n in pairs(all) do
      table.insert(list, code .. ":" .. n)
   end
   table.sort(list)
   local st = #list > 0 and table.concat(list, ",") or "none"
   io.write(string.format(
      "LOCKS pairs=%d post_ok=%d post_bad=%d del_ok=%d del_bad=%d statuses=%s seconds=%.2f p99_ms=%.3f\n",
      t.ok_pairs, t.post_ok, t.post_bad, t.del_ok, t.del_bad, st,
      summary.duration / 1e6, latency:percentile(99.0) / 1000.0))
end
