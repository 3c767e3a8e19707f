"""Assemble README.rst from the parts in this folder, in file-name order."""

import pathlib

here = pathlib.Path(__file__).parent
parts = sorted(here.glob("[0-9][0-9]-*.rst"))
text = "\n\n".join(p.read_text().strip() for p in parts) + "\n"
(here.parent.parent / "README.rst").write_text(text)
print(f"README.rst from {len(parts)} parts")
