# tollgate as the OCI image Istio's WasmPlugin pulls (`url: oci://...`): FROM scratch with a single layer
# holding `plugin.wasm`, the "compat" Wasm image variant Istio reads (istio/istio pkg/wasm/imagefetcher.go:
# the last layer a gzipped tar, with Docker's or OCI's layer media type, holding plugin.wasm). The build
# context is a directory holding only the module, so nothing else is sent to the builder:
#
#   make build
#   mkdir -p target/oci && cp target/wasm32-wasip1/release/tollgate.wasm target/oci/
#   docker build --provenance=false --sbom=false -t $REGISTRY/tollgate:$VERSION -f Dockerfile target/oci
#   docker push $REGISTRY/tollgate:$VERSION
#
# With podman: `podman build -t ... -f Dockerfile target/oci` (no attestations to turn off), then
# `podman push --digestfile digest ...`. `make compose-test` builds it this way and checks the layer, the
# media types and the module byte for byte (deploy/compose/local/check-oci.py).
#
# `--provenance=false --sbom=false` keeps the pushed reference a single image manifest (no attestation
# index), so the digest `docker push` prints is the one Istio checks against WasmPlugin `sha256`.
# See docs/deploy/istio.md for the rest of the steps.
FROM scratch
ARG WASM=tollgate.wasm
COPY ${WASM} ./plugin.wasm
