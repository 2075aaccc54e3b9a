# tollgate as the OCI image Istio's WasmPlugin pulls (`url: oci://...`): FROM scratch with a single layer
# holding `plugin.wasm`, the "compat" Wasm image variant Istio reads. The build context is the directory
# of the built module, so nothing else of the repository is sent to the builder:
#
#   make build
#   docker build --provenance=false --sbom=false -t $REGISTRY/tollgate:$VERSION -f Dockerfile target/wasm32-wasip1/release
#   docker push $REGISTRY/tollgate:$VERSION
#
# `--provenance=false --sbom=false` keeps the pushed reference a single image manifest (no attestation
# index), so the digest `docker push` prints is the one Istio checks against WasmPlugin `sha256`.
# See envoy/istio/README.md for the rest of the steps.
FROM scratch
ARG WASM=tollgate.wasm
COPY ${WASM} ./plugin.wasm
