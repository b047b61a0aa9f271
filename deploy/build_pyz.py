"""Build dist/plantstore.pyz: the whole service in one file, made by the standard
library's zipapp from the modules setup.cfg lists (py_modules), as they stand.

    python deploy/build_pyz.py                   # writes dist/plantstore.pyz
    python dist/plantstore.pyz --port 8000       # runs it, as python plantstore.py
    gunicorn --no-control-socket --pythonpath dist/plantstore.pyz plantstore:app
    PYTHONPATH=dist/plantstore.pyz granian --interface wsgi plantstore:app

Python imports from a .pyz as from a folder (zipimport), so the servers find
plantstore in it. PostgreSQL needs psycopg beside it: pip install 'psycopg[binary]'.
"""

import configparser
import pathlib
import shutil
import sys
import tempfile
import zipapp

HERE = pathlib.Path(__file__).resolve().parent.parent  # the checkout


def build(target=HERE / "dist" / "plantstore.pyz"):
    """Write the .pyz at target; return its path."""
    setup = configparser.ConfigParser()
    setup.read(HERE / "setup.cfg")
    modules = setup["options"]["py_modules"].split()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        for module in modules:
            shutil.copy(HERE / f"{module}.py", folder)
        # zipapp's own main= would drop main()'s exit status
        main = pathlib.Path(folder, "__main__.py")
        main.write_text(
            "import sys\n\nimport plantstore\n\nsys.exit(plantstore.main())\n"
        )
        zipapp.create_archive(
            folder, target, interpreter="/usr/bin/env python3", compressed=True
        )
    return target


if __name__ == "__main__":
    print(build(*(pathlib.Path(path).resolve() for path in sys.argv[1:2])))
