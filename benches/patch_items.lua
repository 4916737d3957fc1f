-- wrk script: unchecked versioned writes through lockstep (benches/postgres.sh,
-- benches/kernel.sh; benches/run.sh drives its PATCH rows with lock_load.rs).
--
-- Run with as many threads as connections (wrk -tN -cN): each thread then has
-- exactly one connection and one key, so its writes go out strictly one after
-- another and never wait for another client's write on the same key:
--     PATCH /items/<thread>   {"title":"bench"}   (no If-Match, no version) -> 200
-- An unchecked write is claimed, forwarded and committed like any write.
--
-- With PATCH_IF_MATCH=1 each thread sends the ETag of its previous answer
-- as If-Match (a checked write, as a careful client sends it; the first
-- request of a thread has no tag yet and goes unchecked). A response without
-- an ETag (a plain nginx proxy) leaves the request without If-Match.
--
-- done() prints one line that benches/postgres.sh parses:
--     PATCHES ok=N bad=N statuses=409:3,503:1 seconds=S p99_ms=X

local threads = {}
local next_id = 1

function setup(thread)
   thread:set("id", next_id)
   table.insert(threads, thread)
   next_id = next_id + 1
end

function init()
   path = "/items/" .. id
   patch_req = wrk.format("PATCH", path,
      { ["Content-Type"] = "application/json" }, '{"title":"bench"}')
   if_match = os.getenv("PATCH_IF_MATCH") == "1"
   etag = nil
   ok, bad = 0, 0
   statuses = {}
end

function request()
   if if_match and etag then
      return wrk.format("PATCH", path,
         { ["Content-Type"] = "application/json", ["If-Match"] = etag }, '{"title":"bench"}')
   end
   return patch_req
end

function response(status, headers, body)
   if if_match then
      etag = headers["ETag"] or headers["etag"]
   end
   if status == 200 then
      ok = ok + 1
   else
      bad = bad + 1
      local key = tostring(status)
      statuses[key] = (statuses[key] or 0) + 1
   end
end

function done(summary, latency, requests)
   local t_ok, t_bad, all = 0, 0, {}
   for _, thread in ipairs(threads) do
      t_ok = t_ok + (thread:get("ok") or 0)
      t_bad = t_bad + (thread:get("bad") or 0)
      for code, n in pairs(thread:get("statuses") or {}) do
         all[code] = (all[code] or 0) + n
      end
   end
   local list = {}
   for code, n in pairs(all) do
      table.insert(list, code .. ":" .. n)
   end
   table.sort(list)
   io.write(string.format("PATCHES ok=%d bad=%d statuses=%s seconds=%.2f p99_ms=%.3f\n",
      t_ok, t_bad, #list > 0 and table.concat(list, ",") or "none",
      summary.duration / 1e6, latency:percentile(99.0) / 1000.0))
end
