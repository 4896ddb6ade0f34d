-- wrk script of the A2A benchmark (a2a_bench.py): POST $WRK_BODY, a JSON-RPC SendMessage, to
-- /a2a with A2A-Version: 1.0, and print one machine-readable line (WRKJSON {...}) when done.
-- A good answer is a 200 whose body is the JSON-RPC result of request id 1, a Message, with the
-- trivial agent's answer inside: the gateway writes {"jsonrpc","id","result"} in that order, so
-- a prefix check is exact and cheap (a2a_bench.py checks the same prefix on sampled answers).
-- A 200 that carries a JSON-RPC error counts as rpcerror, any other body as badbody.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["A2A-Version"] = "1.0"
wrk.body = os.getenv("WRK_BODY")
  or '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m1",'
  .. '"role":"ROLE_USER","parts":[{"data":{"n":1}}],"metadata":{"intent":"bench.echo"}}}}'

local RESULT = '{"jsonrpc":"2.0","id":1,"result":{"message":'
local ERROR = '{"jsonrpc":"2.0","id":1,"error":'
local AGENT = '"data":{"ok":true,"answer":"pong"}'

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

non200 = 0
badbody = 0
rpcerror = 0
function response(status, headers, body)
  if status ~= 200 then
    non200 = non200 + 1
  elseif string.sub(body, 1, #RESULT) == RESULT then
    if not string.find(body, AGENT, #RESULT, true) then
      badbody = badbody + 1
    end
  elseif string.sub(body, 1, #ERROR) == ERROR then
    rpcerror = rpcerror + 1
  else
    badbody = badbody + 1
  end
end

function done(summary, latency, requests)
  local n, b, r = 0, 0, 0
  for _, t in ipairs(threads) do
    n = n + t:get("non200")
    b = b + t:get("badbody")
    r = r + t:get("rpcerror")
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"non200":%d,"badbody":%d,"rpcerror":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, n, b, r, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
