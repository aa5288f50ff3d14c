"""A tiny replica for tests: does what its arguments say, rank by rank.

    child.py ACTION...      ACTION = WHO:VERB[:ARG]
    WHO   *  every rank | N  rank N | N@A  rank N on attempt A only | *@A
    VERB  print:TEXT  sleep:SECONDS  exit:CODE  signal:NAME  raise:EXCEPTION
          pidfile:PATH (write own pid to PATH.<rank>)  forever (sleep until killed)
          wait-file:PATH (sleep until PATH exists)
          trap-term (ignore SIGTERM)  keyword:REGEX (sdk.set_retryable_errors)
          scoped-sleep:LIMIT:SECONDS (sleep inside sdk.hang_detect(LIMIT))
          message:TEXT (sdk.send_custom_message)  env:NAME (print a variable)
          beats:N (sdk.heartbeat for steps 1..N)
          spawn-child (start a grandchild in the same group that sleeps forever)

Actions run in order; a replica that runs out of actions exits 0.
"""

import os
import signal
import subprocess
import sys
import time

rank = int(os.environ.get("RANK", "0"))
attempt = int(os.environ.get("TRAINGUARD_RESTART_COUNT", "0"))  # every framework sets it


def applies(who: str) -> bool:
    r, _, a = who.partition("@")
    return (r == "*" or int(r) == rank) and (not a or int(a) == attempt)


for action in sys.argv[1:]:
    who, verb, *rest = action.split(":", 2)
    arg = rest[0] if rest else ""
    if not applies(who):
        continue
    if verb == "print":
        print(arg.replace("{rank}", str(rank)).replace("{attempt}", str(attempt)), flush=True)
    elif verb == "sleep":
        time.sleep(float(arg))
    elif verb == "wait-file":  # until the test creates PATH
        while not os.path.exists(arg):
            time.sleep(0.02)
    elif verb == "forever":
        while True:
            time.sleep(3600)
    elif verb == "exit":
        sys.exit(int(arg))
    elif verb == "signal":
        os.kill(os.getpid(), signal.Signals["SIG" + arg.upper().removeprefix("SIG")])
        time.sleep(5)
    elif verb == "raise":
        raise {"KeyError": KeyError, "ValueError": ValueError}[arg]("boom")
    elif verb == "trap-term":  # ignore the master's SIGTERM: only SIGKILL ends it
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    elif verb == "keyword":  # the SDK's set_retryable_errors, from inside the replica
        from trainguard import sdk

        sdk.set_retryable_errors([arg])
    elif verb == "scoped-sleep":  # SECONDS inside sdk.hang_detect(LIMIT), LIMIT:SECONDS
        from trainguard import sdk

        limit, seconds = arg.split(":")
        with sdk.hang_detect(float(limit)):
            time.sleep(float(seconds))
    elif verb == "beats":  # heartbeats for steps 1..N, 0.1 s apart
        from trainguard import sdk

        for step in range(1, int(arg) + 1):
            sdk.heartbeat(step)
            time.sleep(0.1)
    elif verb == "message":
        from trainguard import sdk

        sdk.send_custom_message(arg)
    elif verb == "env":  # print one variable of the environment
        print(f"{arg}={os.environ.get(arg)}", flush=True)
    elif verb == "pidfile":
        with open(f"{arg}.{rank}", "w") as fh:
            fh.write(str(os.getpid()))
    elif verb == "spawn-child":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(f"{arg}.{rank}.child", "w") as fh:
            fh.write(str(child.pid))
    else:
        sys.exit(f"child.py: unknown verb {verb!r}")
