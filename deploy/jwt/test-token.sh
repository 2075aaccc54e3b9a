#!/usr/bin/env bash
# A key, its JWKS and signed tokens, to try a per-user limit without an identity provider
# (docs/recipes.md, "Per user"). For trying only: the private key sits in a file beside the JWKS.
#
#   deploy/jwt/test-token.sh DIR SUB [ISSUER]
#
# The first call in DIR makes DIR/jwt.key (RSA 2048) and DIR/jwks.json, its public half for
# jwt_authn's `local_jwks`; each call prints an RS256 token for subject SUB from ISSUER (default
# https://auth.example.com, the recipe's), valid for a day. SUB is letters, digits and . _ @ -.
# Needs openssl and coreutils.
set -euo pipefail

usage() { echo "usage: $0 DIR SUB [ISSUER]" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || usage
dir=$1 sub=$2 issuer=${3:-https://auth.example.com}
[[ $sub =~ ^[A-Za-z0-9._@-]+$ ]] || { echo "$0: SUB must be letters, digits and . _ @ -" >&2; exit 2; }
[[ $issuer =~ ^[A-Za-z0-9._:/@-]+$ ]] || { echo "$0: ISSUER has a character this script does not quote" >&2; exit 2; }

b64url() { base64 -w0 | tr '+/' '-_' | tr -d '='; }

mkdir -p "$dir"
if [ ! -f "$dir/jwt.key" ]; then
  openssl genrsa -out "$dir/jwt.key" 2048 2>/dev/null
  modulus=$(openssl rsa -in "$dir/jwt.key" -noout -modulus | sed 's/^Modulus=//')
  # The modulus' bytes, from its hex digits.
  n=$(printf '%b' "$(sed 's/../\\x&/g' <<<"$modulus")" | b64url)
  printf '{"keys":[{"kty":"RSA","alg":"RS256","use":"sig","kid":"test","n":"%s","e":"AQAB"}]}\n' \
    "$n" >"$dir/jwks.json"
fi

now=$(date +%s)
header=$(printf '{"alg":"RS256","typ":"JWT","kid":"test"}' | b64url)
payload=$(printf '{"iss":"%s","sub":"%s","iat":%d,"exp":%d}' "$issuer" "$sub" "$now" "$((now + 86400))" | b64url)
signature=$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -sign "$dir/jwt.key" | b64url)
echo "$header.$payload.$signature"
