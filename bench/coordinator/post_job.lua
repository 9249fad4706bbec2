-- wrk script: POST /v1/jobs with a unique job name per request (thread id + counter).
local counter = 0
local tid = 0
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  tid = tonumber(wrk.thread:get("tid")) or 0
end

function request()
  counter = counter + 1
  local body = string.format('{"name":"bench-%d-%d-%d","workers":4,"iterations":100}',
                             os.time(), tid, counter)
  return wrk.format("POST", "/v1/jobs", {["Content-Type"] = "application/json"}, body)
end
