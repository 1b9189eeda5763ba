"""Take docs/_static/dashboard.png: the Problems dashboard of a real site with sample data.

    .venv/bin/python docs/_tools/screenshot.py

Sets up a throwaway site (its own SQLite database and var/ under a temporary
directory), records some Recovery events, starts jobs that run, fail, wait and
get paused, serves it with gunicorn on 127.0.0.1 beside a real worker, logs in
with headless Chromium (Debian's /usr/bin/chromium through Playwright) and
screenshots the Summary page while jobs are in progress. Nothing leaves loopback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "_static" / "dashboard.png"
PY = sys.executable
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def manage(env: dict[str, str], *args: str, check: bool = True) -> str:
    done = subprocess.run(
        [PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


def sample_data(env: dict[str, str]) -> None:
    events = [
        ("backup-created", "info", "--done", "Backed up wekan.sqlite to backup/2026-12-02"),
        ("integrity-ok", "info", "--done", "Nightly scan: 18,204 files, no changes"),
        ("corruption-detected", "error", "--failed", "attachments/2026/11/scan-0042.pdf changed"),
        ("restore-backup", "warning", "--failed", "Restore of before-upgrade stopped by operator"),
        ("backup-verified", "info", "--done", "backup/2026-12-02 read back: 412 parts verified"),
    ]
    for kind, severity, done, detail in events:
        manage(env, "record_recovery_event", kind, "--detail", detail, "--severity", severity,
               "--db", "wekan", done)  # fmt: skip
    # A backup whose part file is damaged afterwards: its restore fails for real, with the
    # reason, before a row is touched.
    manage(env, "backup_database", "--name", "nightly", "--inline")
    part = sorted((Path(env["VAR_DIR"]) / "backups" / "nightly").glob("*.jsonl.gz"))[0]
    part.write_bytes(part.read_bytes()[:-7] + b"damaged")
    manage(env, "restore_database", "nightly", "--inline", check=False)
    # A move to a disk that is not mounted pauses, saying what to do.
    (Path(env["VAR_DIR"]).parent / "uploads" / "2025").mkdir(parents=True)
    (Path(env["VAR_DIR"]).parent / "uploads" / "2025" / "report.pdf").write_bytes(b"%PDF-1.7")
    manage(env, "move_files", "uploads", "archive", "--prefix", "2025/")
    for units, sleep in ((40, 0.5), (25, 0.8), (60, 0.3)):
        job_input = json.dumps({"units": units, "sleep": sleep})
        manage(env, "enqueue_job", "durable.noop", "--input", job_input)
    for _ in range(3):
        manage(env, "enqueue_job", "durable.noop", "--input", '{"units": 5}', "--queue", "later")


def main() -> int:
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="dashboard-shot-") as tmp:
        var = Path(tmp) / "var"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "recovery.settings",
            "DATABASE_URL": f"sqlite:///{tmp}/db.sqlite3",
            "VAR_DIR": str(var),
            "SECRET_KEY": "screenshot-only-not-a-secret",
            "ADMIN_USERNAME": "admin",
            "ADMIN_PASSWORD": "screenshot-only-password",
            "DURABLE_RETENTION": "off",
            "RECOVERY_INGEST_INTERVAL": "0",
            "FILE_STORAGES": f"uploads={tmp}/uploads,archive={tmp}/not-mounted",
        }
        manage(env, "migrate", "--noinput")
        manage(env, "collectstatic", "--noinput", "--verbosity", "0")
        manage(env, "ensure_admin")
        sample_data(env)
        port = free_port()
        processes = [
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "gunicorn",
                    "-c",
                    "gunicorn.conf.py",
                    "recovery.wsgi",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    "1",
                    "--threads",
                    "4",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            subprocess.Popen(
                [PY, "manage.py", "runworker", "--concurrency", "3"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        ]
        try:
            wait_for_port(port)
            base = f"http://127.0.0.1:{port}"
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
                )
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                # Two refusals for the Security report: a wrong password, an unknown token.
                page.goto(f"{base}/problems/login/")
                page.fill("#id_username", "mallory")
                page.fill("#id_password", "guess")
                page.click("button[type=submit]")
                page.request.get(f"{base}/api/jobs", headers={"Authorization": "Bearer dur_x_y"})
                page.goto(f"{base}/problems/login/?next=/problems/")
                page.fill("#id_username", "admin")
                page.fill("#id_password", "screenshot-only-password")
                page.click("button[type=submit]")
                page.wait_for_url(f"{base}/problems/")
                time.sleep(6)  # the jobs get going; the page refreshes itself every 2 s
                page.reload()
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(OUT))
                browser.close()
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=30)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
