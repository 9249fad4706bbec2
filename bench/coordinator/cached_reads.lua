-- wrk script of cached_reads.sh: GET of a job, its plan, its groups and its timeline, in turn
-- (what the web view and wagmactl watch read), on one connection after another.
local paths = {"/v1/jobs/bench", "/v1/jobs/bench/plan", "/v1/jobs/bench/groups",
               "/v1/jobs/bench/events"}
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", paths[(i % #paths) + 1])
end
