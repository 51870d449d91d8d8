"""Claim: every function declared in the public headers (include/plexus/*.h)
has a comment: directly above its declaration, or above the group of
declarations it belongs to (consecutive lines, no blank line between), or
on its own line after it.  That comment is what the API reference (Doxygen,
docs/Doxyfile) shows for it.  The test proves it can fail: a copy of the
headers with the comment above px_zoo_cnn removed must be reported as
exactly that one function.  When doxygen is installed, docs/Doxyfile is
built into a temporary directory and the reference must hold zoo.h's page
with px_zoo_cnn's comment."""

import glob
import os
import re
import shutil
import subprocess
import tempfile

import cli_util as cu

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
check = cu.check


def decls(path):
    lines = open(path).read().split('\n')
    out = []
    depth = 0  # brace depth (structs, extern "C" excluded)
    i = 0
    in_comment = False
    stmt_start = None
    for i, raw in enumerate(lines):
        line = raw
        # strip comments for structure
        code = ''
        j = 0
        while j < len(line):
            if in_comment:
                k = line.find('*/', j)
                if k < 0: j = len(line); break
                in_comment = False; j = k + 2
            else:
                k1 = line.find('/*', j); k2 = line.find('//', j)
                if k2 >= 0 and (k1 < 0 or k2 < k1):
                    code += line[j:k2]; break
                if k1 < 0: code += line[j:]; break
                code += line[j:k1]; in_comment = True; j = k1 + 2
        s = code.strip()
        if s.startswith('#') or s.startswith('extern "C"'):
            continue
        if depth == 0 and stmt_start is None and s and s != '}':
            stmt_start = i
        depth += s.count('{') - s.count('}')
        if depth < 0: depth = 0
        if depth == 0 and stmt_start is not None and (s.endswith(';') or s.endswith('}')):
            text = ' '.join(lines[stmt_start:i+1])
            code_text = re.sub(r'/\*.*?\*/', '', text)
            m = re.match(r'\s*(?:static\s+inline\s+)?[\w\s\*]*?\b(px_\w+)\s*\(', code_text)
            if m and not code_text.lstrip().startswith('typedef'):
                out.append((m.group(1), stmt_start, i))
            stmt_start = None
    return lines, out

def documented(lines, start, end):
    # same-line trailing comment on the declaration
    if '/*' in lines[end] or '//' in lines[end]:
        return True
    k = start - 1
    while k >= 0:
        t = lines[k].strip()
        if t.endswith('*/') or t.startswith('//'):
            return True
        if t == '' or t.startswith('#') or t.endswith('{') or t == '}' or t.startswith('}'):
            return False
        k -= 1
    return False


def undocumented(include_dir):
    """(number of public functions, ["file:line: name" lacking a comment])."""
    bad, total = [], 0
    for h in sorted(glob.glob(os.path.join(include_dir, "*.h"))):
        lines, ds = decls(h)
        for name, s, e in ds:
            total += 1
            if not documented(lines, s, e):
                bad.append("%s:%d: %s" % (os.path.basename(h), s + 1, name))
    return total, bad


def main():
    inc = os.path.join(ROOT, "include", "plexus")
    total, bad = undocumented(inc)
    check(total > 300, "found %d public functions; the parser lost declarations" % total)
    check(not bad, "public functions without a comment:\n  " + "\n  ".join(bad))

    # The check can fail: remove the comment above px_zoo_cnn in a copy.
    tmp = tempfile.mkdtemp(prefix="px_doc_")
    try:
        for h in glob.glob(os.path.join(inc, "*.h")):
            shutil.copy(h, tmp)
        p = os.path.join(tmp, "zoo.h")
        src = open(p).read()
        decl = "px_module *px_zoo_cnn("
        i = src.index(decl)
        j = src.rindex("/*", 0, i)
        check(src[j:i].rstrip().endswith("*/"), "zoo.h: px_zoo_cnn's comment is directly above it")
        open(p, "w").write(src[:j] + src[i:])
        _, bad2 = undocumented(tmp)
        check([b.split(": ")[-1] for b in bad2] == ["px_zoo_cnn"],
              "with px_zoo_cnn's comment removed the check reports %r, expected exactly px_zoo_cnn" % bad2)

        doxygen = shutil.which("doxygen")
        if doxygen:
            out = os.path.join(tmp, "api")
            cfg = open(os.path.join(ROOT, "docs", "Doxyfile")).read()
            cfg = re.sub(r"(?m)^OUTPUT_DIRECTORY\s*=.*$", "OUTPUT_DIRECTORY = " + out, cfg)
            r = subprocess.run([doxygen, "-"], input=cfg, text=True, cwd=ROOT, capture_output=True, timeout=600)
            check(r.returncode == 0, "doxygen docs/Doxyfile failed: %s" % r.stderr[-2000:])
            page = os.path.join(out, "html", "zoo_8h.html")
            if check(os.path.exists(page), "doxygen wrote no page for zoo.h"):
                html = open(page, encoding="utf-8").read()
                check("px_zoo_cnn" in html and "Two convolution stages" in html,
                      "zoo.h's page lacks px_zoo_cnn's comment")
        else:
            print("doxygen not installed: the reference build is not checked (apt-get install doxygen)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d public functions" % total)
    cu.finish("test_public_functions_have_comments")


if __name__ == "__main__":
    main()
