"""Claim: libplexus.so exports exactly its API.  Every dynamic symbol it
defines (nm -D --defined-only) is a function declared in include/plexus/*.h,
no internal name (pxt_, pxz_, pxr_, px_ckpt_, px_st_, px_sha256_, px_mpi_)
is among them, and every function the public headers declare is
exported (a definition that does not see its public header would be hidden).
The resolvers gcc emits beside an ifunc (`px_axpy.resolver`, for a function
built for several CPUs) are allowed only beside their exported ifunc.

If it failed, programs could link against internals that change without
notice, two copies of an internal name could clash with a user's symbols,
or a documented function would be missing from the shared library."""
import glob
import os
import re
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.dirname(here)
build = os.environ.get("PX_BUILD_DIR", "build")
lib = os.path.join(build, "libplexus.so")
INTERNAL = ("pxt_", "pxz_", "pxr_", "px_ckpt_", "px_st_", "px_sha256_", "px_mpi_")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def declared_functions():
    """Names of the functions include/plexus/*.h declare (comments and
    preprocessor lines removed; function-pointer typedefs `(*px_x)` and
    macros are not functions)."""
    names = set()
    for path in sorted(glob.glob(os.path.join(src, "include", "plexus", "*.h"))):
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        text = re.sub(r"^\s*#.*?(?<!\\)$", " ", text, flags=re.M | re.S)
        # `px_foo(` is a declaration; `(*px_foo)(` (a function-pointer
        # typedef) and `px_type (*fn)(` (a type before a pointer) are not.
        for m in re.finditer(r"(?<!\(\*)(?<!\( \*)\b(px_\w+)\s*\((?!\s*\*)", text):
            names.add(m.group(1))
        # static inline functions are the caller's code, never exported.
        for m in re.finditer(r"\bstatic\s+inline\b[^;{]*?\b(px_\w+)\s*\(", text):
            names.discard(m.group(1))
    return names


out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
if out.returncode != 0:
    print(out.stderr)
    sys.exit(1)
exported = {}
for line in out.stdout.splitlines():
    parts = line.split()
    if len(parts) == 3:
        exported[parts[2].split("@")[0]] = parts[1]

# A public function built for several CPUs (PX_KERNEL: gcc's target_clones)
# is an ifunc, and gcc exports its resolver as `<name>.resolver` beside it:
# not a C identifier, so no program can name it.  Allowed for a declared
# name that is itself exported as an ifunc, and only then.
resolvers = {n for n in exported if n.endswith(".resolver")}
for r in sorted(resolvers):
    base = r[: -len(".resolver")]
    check(exported.get(base) == "i", f"{r} is exported but {base} is not an exported ifunc")
    del exported[r]

declared = declared_functions()
print(f"{len(exported)} symbols exported, {len(declared)} functions declared in include/plexus/")
check(len(declared) > 200, f"the header parser found only {len(declared)} functions")
for name, kind in sorted(exported.items()):
    check(name in declared, f"{name} ({kind}) is exported but not declared in include/plexus/")
    check(not name.startswith(INTERNAL), f"{name} has an internal prefix and is exported")
    check(kind in ("T", "W", "i"), f"{name} is exported as {kind}, not a function")
for name in sorted(declared - set(exported)):
    check(False, f"{name} is declared in include/plexus/ but not exported from libplexus.so")

if failures:
    print(f"{failures} failure(s)")
    sys.exit(1)
print("test_exported_symbols_are_declared_in_public_headers: ok")
