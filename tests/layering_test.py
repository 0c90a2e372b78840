#!/usr/bin/env python3
"""The layering of the source folders, checked on their #include lines.

server -> scheduler -> engine -> model, memory -> kernels -> base, with proto (the
API's messages), jinja (the chat-template interpreter, which model/ and server/
use) and grammar (constrained decoding, which engine/ and server/ use) beside base: a folder includes headers of the folders below it only
(model/ and memory/ side by side: neither knows the other).
Beyond that: no header above kernels/ names a CPU or CUDA kernel header
(kernels/cpu/, kernels/cuda/; the seam is kernels/backend.h and kernels/types.h),
and only server/, loadtest/ (a client of the API alone) and the clients in tools/
include generated gRPC service code.
tools/, bench/ and tests/ sit on top and may include anything.
Exits non-zero and lists every violation.
"""
import pathlib
import re
import sys

ALLOWED = {
    "base": {"base"},
    "proto": {"proto"},
    "jinja": {"jinja", "base"},
    "grammar": {"grammar", "base"},
    "kernels": {"kernels", "base"},
    "model": {"model", "jinja", "kernels", "base"},
    "memory": {"memory", "kernels", "base"},
    "engine": {"engine", "model", "memory", "grammar", "kernels", "proto", "base"},
    "scheduler": {"scheduler", "engine", "memory", "base"},
    "server": {"server", "scheduler", "engine", "model", "memory", "jinja", "grammar", "kernels", "proto", "base"},
    "loadtest": {"loadtest", "proto", "base"},  # a gRPC client: the API only
}
FOLDERS = set(ALLOWED) | {"tools", "bench", "tests"}  # the repository's top-level source folders
GENERATED = ("pruneserve/", "grpc/")  # protoc's output, in the build tree
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    problems = []
    checked = 0
    for folder, allowed in ALLOWED.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".cc", ".cu", ".cuh", ".inc"):
                continue
            checked += 1
            rel = path.relative_to(root)
            for inc in INCLUDE.findall(path.read_text(errors="replace")):
                top = inc.split("/")[0]
                if inc.startswith(GENERATED):
                    if inc.endswith(".grpc.pb.h") and folder not in ("server", "loadtest"):
                        problems.append(f"{rel}: includes gRPC service code {inc} (only server/ and loadtest/ may)")
                    elif folder not in ("proto", "engine", "server", "loadtest"):
                        problems.append(f"{rel}: includes the API's messages {inc}")
                    continue
                if "/" not in inc or top not in FOLDERS:
                    continue  # a file beside it, or a library's header
                if top not in allowed:
                    problems.append(f"{rel}: includes {inc}, from {top}/, which is not below {folder}/")
                elif (folder != "kernels" and path.suffix in (".h", ".cuh")
                      and inc.startswith(("kernels/cpu/", "kernels/cuda/"))):
                    problems.append(f"{rel}: a header above kernels/ includes the kernel header {inc}")
    for p in problems:
        print(p)
    print(f"{checked} files checked, {len(problems)} layering violations")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
