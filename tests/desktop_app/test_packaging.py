"""Folio as an installed package: the desktop entry, and (slow) a wheel installed into a
fresh venv that starts the app with its icons from the wheel, not from this checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from desktop_app.__main__ import main, xdg_data_home
from desktop_app.widgets import theme

REPO = Path(__file__).resolve().parents[2]


def test_install_desktop_entry_writes_entry_and_icon(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    assert main(["--install-desktop-entry"]) == 0
    entry = tmp_path / "share/applications/folio.desktop"
    icon = tmp_path / "share/icons/hicolor/scalable/apps/folio.svg"
    assert capsys.readouterr().out.split() == ["installed", str(entry), "installed", str(icon)]
    lines = entry.read_text().splitlines()
    assert lines[0] == "[Desktop Entry]"
    assert "Icon=folio" in lines and "Name=Folio" in lines
    [exec_line] = [line for line in lines if line.startswith("Exec=")]
    assert "folio-app" in exec_line or "-m desktop_app" in exec_line
    assert icon.read_text() == theme.asset_text("folio.svg")
    # Running it again replaces the files and leaves no temp files behind.
    assert main(["--install-desktop-entry"]) == 0
    assert sorted(p.name for p in entry.parent.iterdir()) == ["folio.desktop"]


def test_xdg_data_home_default_and_relative_path_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert xdg_data_home() == tmp_path / ".local/share"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")
    assert xdg_data_home() == tmp_path / ".local/share"


def test_check_assets_lists_every_icon(capsys, qapp):
    assert main(["--check-assets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(theme.icon_names())
    assert all(line.startswith("ok ") for line in lines)
    assert f"ok folio {theme.ASSETS_DIR / 'folio.svg'}" in lines


@pytest.mark.slow
def test_wheel_installs_and_runs_from_a_fresh_venv(tmp_path, tiny_model_path):
    # Build from a copy of the sources (nothing written into the checkout), offline.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for package in ("engine", "kernels", "desktop_app"):
        shutil.copytree(REPO / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(dist), str(src)], cwd=tmp_path)
    [wheel] = dist.glob("folio-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for icon in theme.icon_names():
        assert f"desktop_app/assets/{icon}.svg" in names
    assert "desktop_app/assets/folio.desktop" in names
    assert "desktop_app/data/catalog.json" in names  # the Models dialog's catalog
    assert not any(n.startswith("tests/") for n in names)
    # The native kernels' sources ride along (python -m kernels.cpu.build), never a build.
    sources = {str(p.relative_to(REPO)) for p in (REPO / "kernels/cpu/csrc").rglob("*")
               if p.is_file()}
    assert sources and sources <= names
    assert not any(n.endswith((".so", ".pyd", ".o")) for n in names)

    # A fresh venv with only the wheel; the dependencies (torch, Qt...) come from this
    # venv's site-packages on PYTHONPATH, which holds no copy of Folio's packages (the
    # editable install is a .pth finder, and .pth files on PYTHONPATH are not run).
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)], cwd=tmp_path)
    app = venv / "bin" / "folio-app"
    assert app.is_file()
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"],
           "QT_QPA_PLATFORM": "offscreen", "FOLIO_DATA_DIR": str(home / "data"),
           "FOLIO_CONFIG_DIR": str(home / "config"), "XDG_DATA_HOME": str(home / "share"),
           "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    site = Path(run([str(python), "-c", "import desktop_app, pathlib; "
                     "print(pathlib.Path(desktop_app.__file__).parent)"],
                    cwd=tmp_path, env=env).stdout.strip())
    assert site.is_relative_to(venv), site  # the wheel's copy, not the checkout

    out = run([str(app), "--check-assets"], cwd=tmp_path, env=env).stdout.splitlines()
    assert len(out) == len(theme.icon_names())
    for line in out:
        status, name, where = line.split(" ", 2)
        assert status == "ok" and Path(where) == site / "assets" / f"{name}.svg", line

    # The window shows, loads the model, closes 300 ms later and exits 0 (1 if the load
    # failed); closing saved the settings, last_model included.
    started = run([str(app), "--model", str(tiny_model_path), "--quit-after-ms", "300"],
                  cwd=tmp_path, env=env, timeout=240)
    log = started.stdout + started.stderr
    assert "model tiny loaded" in log, log
    for bad in ("Traceback", "no icon", "FileNotFoundError", "failed to load"):
        assert bad not in log, log
    saved = json.loads((home / "config" / "settings.json").read_text())
    assert saved["last_model"] == str(tiny_model_path)

    run([str(app), "--install-desktop-entry"], cwd=tmp_path, env=env)
    entry = (home / "share/applications/folio.desktop").read_text().splitlines()
    assert f"Exec={app}" in entry
    assert (home / "share/icons/hicolor/scalable/apps/folio.svg").is_file()


def run(cmd, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (cmd, result.stdout[-3000:], result.stderr[-3000:])
    return result


def test_install_desktop_entry_reports_an_unwritable_folder(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker))
    assert main(["--install-desktop-entry"]) == 1
    assert "could not install the desktop entry" in capsys.readouterr().err
