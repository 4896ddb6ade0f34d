-- wrk script of the benchmarks: POST $WRK_BODY as JSON, count answers that are not
-- 200 {"ok":true,...}, and print one machine-readable line (WRKJSON {...}) when done.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("WRK_BODY") or '{"intent":"bench.echo","payload":{"n":1}}'

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

non200 = 0
badbody = 0
function response(status, headers, body)
  if status ~= 200 then
    non200 = non200 + 1
  elseif not string.find(body, '"ok":true', 1, true) then
    badbody = badbody + 1
  end
end

function done(summary, latency, requests)
  local n, b = 0, 0
  for _, t in ipairs(threads) do
    n = n + t:get("non200")
    b = b + t:get("badbody")
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"non200":%d,"badbody":%d,"connect":%d,' ..
    '"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, n, b, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
