#!/usr/bin/env bash
# `envoy --mode validate` on every Envoy configuration the repository ships (`make validate`).
#
#   deploy/validate-envoy.sh [ENVOY] [TOLLGATE_WASM]
#
# Every *.yaml under envoy/ and deploy/ that is an Envoy bootstrap (has `static_resources:`) is rendered
# with dummy ports, envoy/demo-config.json as {{PLUGIN_CONFIG}} and a real .wasm as {{WASM_PATH}}, then
# validated. Validation loads the module and runs the filter's on_configure, so a plugin configuration
# the filter rejects fails here too. A placeholder this script does not know fails the run, so a new
# template cannot slip through unvalidated. Rendered files and Envoy's output go to target/validate/.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
envoy=${1:-.venv/bin/envoy}
tollgate_wasm=${2:-target/wasm32-wasip1/release/tollgate.wasm}
out=target/validate
mkdir -p "$out"

[ -x "$envoy" ] || { echo "validate: $envoy not found (run make setup)" >&2; exit 1; }
[ -f "$tollgate_wasm" ] || { echo "validate: $tollgate_wasm not found (run make build)" >&2; exit 1; }
tollgate_wasm=$(cd "$(dirname "$tollgate_wasm")" && pwd)/$(basename "$tollgate_wasm")

# The module a template's {{WASM_PATH}} stands for: tollgate's, except the bench's empty filter.
wasm_for() {
  case "$1" in
    envoy/bench/wasm-floor.yaml|envoy/bench/wasm-floor-calls.yaml|envoy/bench/wasm-floor-hold.yaml)
      cargo build --quiet --release --target wasm32-wasip1 \
        --manifest-path bench/wasm-floor/Cargo.toml --target-dir target/wasm-floor >&2
      echo "$root/target/wasm-floor/wasm32-wasip1/release/wasm_floor.wasm" ;;
    *) echo "$tollgate_wasm" ;;
  esac
}

# Escapes text for the replacement side of a sed `s|...|...|` command.
sed_escape() { printf '%s' "$1" | sed -e 's/[\\&|]/\\&/g'; }
# Text for the inside of a YAML single-quoted scalar.
yaml_single() { printf '%s' "${1//\'/\'\'}"; }

plugin_config=$(tr '\n' ' ' < envoy/demo-config.json)

failed=0
count=0
while IFS= read -r file; do
  grep -q '^static_resources:' "$file" || continue
  count=$((count + 1))
  wasm=$(wasm_for "$file")
  rendered="$out/$(echo "$file" | tr '/' '_')"
  sed -e "s|{{ADMIN_PORT}}|19901|g" \
      -e "s|{{LISTEN_PORT}}|10000|g" \
      -e "s|{{BACKEND_PORT}}|17379|g" \
      -e "s|{{UPSTREAM_PORT}}|18080|g" \
      -e "s|{{ACCESS_LOG}}|/dev/stdout|g" \
      -e "s|{{SEED_PORT_1}}|17001|g" -e "s|{{SEED_PORT_2}}|17002|g" -e "s|{{SEED_PORT_3}}|17003|g" \
      -e "s|{{REDIS_HOST}}|redis.example.internal|g" -e "s|{{REDIS_PORT}}|6379|g" \
      -e "s|{{CA_FILE}}|/etc/ssl/certs/ca-certificates.crt|g" \
      -e "s|{{WASM_PATH}}|$(sed_escape "$(yaml_single "$wasm")")|g" \
      -e "s|'/etc/tollgate/tollgate.wasm'|'$(sed_escape "$(yaml_single "$wasm")")'|g" \
      -e "s|{{PLUGIN_CONFIG}}|$(sed_escape "$(yaml_single "$plugin_config")")|g" \
      "$file" > "$rendered"
  if left=$(grep -v '^[[:space:]]*#' "$rendered" | grep -o '{{[A-Za-z0-9_]*}}' | sort -u | tr '\n' ' ') \
      && [ -n "$left" ]; then
    echo "FAIL $file: placeholders deploy/validate-envoy.sh does not fill: $left"
    failed=1
    continue
  fi
  if "$envoy" --mode validate -l warning -c "$rendered" > "$rendered.log" 2>&1; then
    echo "ok   $file"
  else
    echo "FAIL $file (rendered: $rendered)"
    grep -E 'critical|error' "$rendered.log" | tail -5 | sed 's/^/     /'
    failed=1
  fi
done < <(find envoy deploy -name '*.yaml' -type f | sort)

if [ "$count" -eq 0 ]; then
  echo "validate: no Envoy configuration found" >&2
  exit 1
fi
exit "$failed"
