"""relevo-agent's dependencies, with relevo-core taken from the same checkout.

`pipx install ./agent` (or `pip install ./agent`) builds this directory in place, so the core
package next to it (../layers/core) is installed along with the agent. Built anywhere else (an
sdist unpacked elsewhere), the plain requirement name is used and the core must come from an index.
"""

from pathlib import Path

from setuptools import setup

CORE = Path(__file__).resolve().parent.parent / "layers" / "core"
CORE_REQUIREMENT = f"relevo-core @ {CORE.as_uri()}" if (CORE / "pyproject.toml").is_file() else "relevo-core"

# PyJWT with cryptography: the ES256 tokens of Apple's APIs (relevo_agent.effects); urllib3 (boto3's
# own) makes their requests.
setup(
    install_requires=[
        CORE_REQUIREMENT,
        "boto3>=1.34",
        "cryptography>=42",
        # Test reports are XML a build wrote: parsed without entity expansion (relevo_core.test_results).
        "defusedxml>=0.7",
        "pydantic>=2.10,<3",
        "PyJWT>=2.8",
        "typer>=0.12",
        "urllib3>=2",
    ]
)
