"""Checks an OCI image layout holds a Wasm image Istio's puller reads, and prints its digest.

Istio's pkg/wasm/imagefetcher.go (PrepareFetch and the extract* functions) takes an image manifest
(not an index) and reads it as the "compat" variant: with the Docker manifest media type the last
layer must be application/vnd.docker.image.rootfs.diff.tar.gzip, otherwise
application/vnd.oci.image.layer.v1.tar+gzip; the layer is a gzipped tar and the module is the entry
whose base name is plugin.wasm, at most 256 MiB (ISTIO_WASM_MAX_BINARY_SIZE_BYTES). The digest a
WasmPlugin pins (`sha256:`) is the manifest's. This image is stricter than Istio needs: one layer,
whose only entry is plugin.wasm, byte for byte the module that was built.

Usage: check-oci.py LAYOUT_DIR WASM_FILE PUSHED_DIGEST"""

import gzip
import hashlib
import io
import json
import sys
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
LAYER_FOR = {
    OCI_MANIFEST: "application/vnd.oci.image.layer.v1.tar+gzip",
    DOCKER_MANIFEST: "application/vnd.docker.image.rootfs.diff.tar.gzip",
}
CONFIG_FOR = {
    OCI_MANIFEST: "application/vnd.oci.image.config.v1+json",
    DOCKER_MANIFEST: "application/vnd.docker.container.image.v1+json",
}
MAX_WASM = 256 * 1024 * 1024


def fail(msg):
    print(f"NOT ACCEPTED: {msg}")
    sys.exit(1)


def blob(layout, digest):
    algo, _, hexd = digest.partition(":")
    with open(f"{layout}/blobs/{algo}/{hexd}", "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != hexd:
        fail(f"blob {digest} does not match its digest")
    return data


def main():
    layout, wasm_path, pushed = sys.argv[1:4]
    with open(f"{layout}/index.json") as f:
        index = json.load(f)
    if len(index["manifests"]) != 1:
        fail(f"{len(index['manifests'])} manifests in the layout, expected 1")
    desc = index["manifests"][0]
    manifest_type = desc.get("mediaType")
    if manifest_type not in LAYER_FOR:
        fail(f"manifest media type {manifest_type} (an index or unknown): Istio needs an image manifest")
    manifest = json.loads(blob(layout, desc["digest"]))
    if manifest.get("mediaType", manifest_type) != manifest_type:
        fail("the manifest's own media type differs from its descriptor's")
    config_type = manifest["config"]["mediaType"]
    if config_type != CONFIG_FOR[manifest_type]:
        fail(f"config media type {config_type}, expected {CONFIG_FOR[manifest_type]}")
    layers = manifest["layers"]
    if len(layers) != 1:
        fail(f"{len(layers)} layers, expected 1")
    layer_type = layers[0]["mediaType"]
    if layer_type != LAYER_FOR[manifest_type]:
        fail(f"layer media type {layer_type}, Istio expects {LAYER_FOR[manifest_type]}")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layout, layers[0]["digest"])))) as tar:
        names = [m.name for m in tar.getmembers() if not m.isdir()]
        if names != ["plugin.wasm"]:
            fail(f"layer entries {names}, expected only plugin.wasm")
        module = tar.extractfile("plugin.wasm").read()
    with open(wasm_path, "rb") as f:
        built = f.read()
    if module != built:
        fail(f"plugin.wasm differs from {wasm_path}")
    if len(module) > MAX_WASM:
        fail(f"plugin.wasm is {len(module)} bytes, over Istio's default limit of {MAX_WASM}")
    if pushed != desc["digest"]:
        fail(f"podman push printed {pushed}, the layout holds {desc['digest']}")
    print(f"manifest {manifest_type}, config {config_type}")
    print(f"one layer {layer_type} holding only plugin.wasm ({len(module)} bytes, the built module)")
    print(f"digest {desc['digest']} (WasmPlugin sha256: {desc['digest'].partition(':')[2]})")


if __name__ == "__main__":
    main()
