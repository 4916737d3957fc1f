-- wrk script: every request reads an item no request has read before.
--
-- The URL's path is a prefix (http://host/v64k/); each request appends a
-- number that grows by one per request and starts at a different base in
-- each wrk thread, so no two requests of a run name the same item:
--     GET /v64k/<base + n>
-- The backend serves the same body for every item. What this measures is a
-- read whose key lockstep has no recent stamp plan for: every body is
-- validated in full, as on the first read of an item or after it changed.

local threads = {}

function setup(thread)
   thread:set("base", #threads * 100000000)
   table.insert(threads, thread)
end

function init()
   prefix = wrk.path
   n = 0
end

function request()
   n = n + 1
   return wrk.format("GET", prefix .. (base + n))
end
