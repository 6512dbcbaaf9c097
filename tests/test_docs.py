"""Every Python code block of the README and the user guide runs.

The blocks of one document run in order, in one namespace (a later block
uses the names of an earlier one, as a reader does), as one script in a
fresh process with a scratch working directory. A block that raises fails
the test with the block's source.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "docs/user-guide.rst"]


def python_blocks(path: pathlib.Path) -> list[str]:
    text = path.read_text()
    if path.suffix == ".md":
        return [m.group(1) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]
    blocks = []
    for m in re.finditer(r"^\.\. code-block:: python\n\n((?:(?:[ \t]+.*)?\n)+)", text, re.M):
        blocks.append(textwrap.dedent(m.group(1)))
    return blocks


def _script(blocks: list[str]) -> str:
    # Inside main() behind the guard: a block may start a process-based cluster.
    parts = ["def main():"]
    for i, block in enumerate(blocks):
        parts.append(f"    print('--- block {i}', flush=True)")
        parts.append(textwrap.indent(block.rstrip() + "\n", "    "))
    parts.append("    print('--- all blocks ran', flush=True)")
    parts.append("\n\nif __name__ == '__main__':\n    main()\n")
    return "\n".join(parts)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_code_blocks_run(document, tmp_path):
    path = ROOT / document
    if not path.exists():
        pytest.skip("not a source checkout")
    blocks = python_blocks(path)
    assert blocks, f"no python code blocks found in {document}"
    script = tmp_path / "blocks.py"
    script.write_text(_script(blocks))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=420)
    ran = re.findall(r"--- block (\d+)", out.stdout)
    failed_at = int(ran[-1]) if ran else 0
    assert out.returncode == 0 and "--- all blocks ran" in out.stdout, (
        f"{document}: block {failed_at} failed:\n{blocks[failed_at]}\n--- stderr:\n{out.stderr[-4000:]}"
    )
