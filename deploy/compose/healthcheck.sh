#!/bin/bash
# The healthchecks of docker-compose.yaml, mounted read-only into the webdis and envoy containers.
# Kept in a file so every engine runs the same check: a `test:` list whose arguments hold spaces or
# quotes is re-quoted by podman-compose (1.0 to 1.4) into a command that never succeeds.
#   healthcheck.sh webdis   healthy when a script runs through Webdis on Redis:
#                           GET /EVAL/return 1/0 answers {"EVAL":1} (the one kind of command its ACL allows)
#   healthcheck.sh envoy    healthy when Envoy's admin /ready answers LIVE (what the tests poll)
case "${1:-}" in
  webdis)
    exec 3<>/dev/tcp/127.0.0.1/7379 &&
      printf 'GET /EVAL/return%%201/0 HTTP/1.0\r\n\r\n' >&3 &&
      grep -q '"EVAL":1' <&3 ;;
  envoy)
    exec 3<>/dev/tcp/127.0.0.1/9901 &&
      printf 'GET /ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3 &&
      grep -q LIVE <&3 ;;
  *)
    echo "usage: healthcheck.sh webdis|envoy" >&2
    exit 2 ;;
esac
