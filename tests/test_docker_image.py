"""The engine image builds and runs on any architecture Debian ships Java 17 for (amd64, arm64).

No Docker engine here, so this is the documented check instead of a build: the Dockerfile names
no architecture, and the script that finds JAVA_HOME at build time (``docker/java-home``) is run
against JDK trees laid out as Debian lays them out on amd64 and on arm64, and against this
machine's own Java.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "engine.Dockerfile"
JAVA_HOME_SCRIPT = ROOT / "docker" / "java-home"
ARCHITECTURES = re.compile(r"amd64|arm64|aarch64|x86_64|i386|ppc64|s390x|armhf|armel", re.I)


def _instructions() -> str:
    """The Dockerfile without its comments."""
    lines = DOCKERFILE.read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def _java_home(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(JAVA_HOME_SCRIPT)],
        capture_output=True,
        text=True,
        env={"PATH": path},
        check=False,
    )


def _tools(directory: Path) -> Path:
    """A PATH entry with the utilities the script needs, and no java."""
    directory.mkdir()
    for tool in ("dirname", "readlink"):
        found = shutil.which(tool)
        assert found, tool
        (directory / tool).symlink_to(found)
    return directory


def test_the_dockerfile_names_no_architecture() -> None:
    instructions = _instructions()
    assert not ARCHITECTURES.findall(instructions), ARCHITECTURES.findall(instructions)
    java_home = re.search(r"\bJAVA_HOME=(\S+)", instructions)
    assert java_home, "JAVA_HOME is set"
    # The link JAVA_HOME names is made from what docker/java-home finds, in the same image.
    assert f'ln -s "$(sh /usr/local/bin/java-home)" {java_home.group(1)}' in instructions
    assert "COPY docker/java-home /usr/local/bin/java-home" in instructions


@pytest.mark.parametrize("architecture", ["amd64", "arm64"])
def test_java_home_follows_the_java_on_path_to_its_jdk(tmp_path: Path, architecture: str) -> None:
    """As Debian installs it: /usr/bin/java -> /etc/alternatives/java -> the JDK's bin/java."""
    home = tmp_path / "usr/lib/jvm" / f"java-17-openjdk-{architecture}"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    (tmp_path / "etc/alternatives").mkdir(parents=True)
    (tmp_path / "etc/alternatives/java").symlink_to(java)
    (tmp_path / "usr/bin").mkdir()
    (tmp_path / "usr/bin/java").symlink_to(tmp_path / "etc/alternatives/java")
    tools = _tools(tmp_path / "tools")
    result = _java_home(f"{tmp_path / 'usr/bin'}:{tools}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{home}\n"


def test_java_home_fails_in_one_line_without_java(tmp_path: Path) -> None:
    result = _java_home(str(_tools(tmp_path / "tools")))
    assert result.returncode == 1
    assert result.stderr == "java-home: no java on PATH\n"


def test_java_home_of_this_machines_java_runs_java() -> None:
    """The Java Spark runs on here (scripts/bootstrap installs it)."""
    result = _java_home(os.environ["PATH"])
    assert result.returncode == 0, result.stderr
    java = Path(result.stdout.strip()) / "bin" / "java"
    version = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    assert version.returncode == 0
    assert "version" in version.stderr
