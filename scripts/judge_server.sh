#!/usr/bin/env bash
# A local judge endpoint: llama.cpp's OpenAI-compatible server (its C++ server from the prebuilt
# xllamacpp wheel, installed by `make test`; python -m grpokit.rewards.judge.local_server)
# serving the embedded SmolLM2-135M-Instruct GGUF.
#
#   scripts/judge_server.sh start [--port P] [--threads N] [--ctx N] [--dir D]
#       starts it in the background on P (default: a free port), waits until it answers, and
#       prints its base URL (http://127.0.0.1:P/v1) as the last line of stdout.
#   scripts/judge_server.sh url  [--dir D]   the URL of the running server (exit 1: none)
#   scripts/judge_server.sh stop [--dir D]   stops it (by its pid file)
#
# State (pid, URL, log) lives in D (default runs/judge-server, or $GRPOKIT_JUDGE_DIR), so that
# several servers run side by side with different --dir. The model alias in requests is
# `smollm2`, as in config.openai.yaml. The server answers one request at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${GRPOKIT_VENV:-.venv}/bin/python
cmd=${1:-}
[ $# -gt 0 ] && shift
dir=${GRPOKIT_JUDGE_DIR:-runs/judge-server}
port=""
threads=1
ctx=2048
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "judge_server.sh: unknown option $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
pidfile=$dir/server.pid
urlfile=$dir/url

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "$cmd" in
  start)
    if running; then
      echo "judge_server.sh: already running (pid $(cat "$pidfile")); stop it first" >&2
      cat "$urlfile"
      exit 0
    fi
    if ! "$PY" -c "import xllamacpp" 2>/dev/null; then
      echo "judge_server.sh: xllamacpp is not installed in $PY's environment;" \
        "run 'make setup' (or: pip install xllamacpp)" >&2
      exit 2
    fi
    if [ -z "$port" ]; then
      port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    fi
    mkdir -p "$dir"
    log=$dir/server.log
    url="http://127.0.0.1:$port/v1"
    # --threads covers reading the prompt too: the judge prompt (rubric + completion) is read in
    # batch mode, which would otherwise use every core.
    nohup "$PY" -m grpokit.rewards.judge.local_server --alias smollm2 \
      --host 127.0.0.1 --port "$port" --ctx "$ctx" --threads "$threads" >"$log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 240); do
      if ! running; then
        echo "judge_server.sh: the server exited; the end of $log:" >&2
        tail -n 20 "$log" >&2
        rm -f "$pidfile"
        exit 1
      fi
      if curl -fsS "$url/models" >/dev/null 2>&1; then
        echo "$url" >"$urlfile"
        echo "judge server (pid $(cat "$pidfile"), $threads thread(s), log $log) at:" >&2
        echo "$url"
        exit 0
      fi
      sleep 0.5
    done
    echo "judge_server.sh: no answer at $url after 120 s; stopping it (log: $log)" >&2
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
    exit 1
    ;;
  url)
    if running; then cat "$urlfile"; else echo "judge_server.sh: not running ($dir)" >&2; exit 1; fi
    ;;
  stop)
    if running; then
      pid=$(cat "$pidfile")
      kill "$pid"
      for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      echo "judge server (pid $pid) stopped" >&2
    fi
    rm -f "$pidfile" "$urlfile"
    ;;
  *)
    echo "usage: scripts/judge_server.sh start|url|stop [--port P] [--threads N] [--ctx N]" \
      "[--dir D]" >&2
    exit 2
    ;;
esac
