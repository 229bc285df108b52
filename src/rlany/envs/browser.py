"""One headless Chromium per process, shared by every episode of a GUI env (one tab each).

`browser()` starts it on first use: Debian's `/usr/bin/chromium` driven by
`/usr/bin/chromedriver` through Selenium (MiniWoB's own variables MINIWOB_CHROME_BINARY /
MINIWOB_CHROMEDRIVER point elsewhere). Nothing is downloaded at run time: Selenium is given
the driver's path, so its Selenium Manager never runs. Missing pieces fail in one line.

Lifetime: chromedriver and every Chromium process it starts carry the environment variable
RLANY_BROWSER=<this process's pid>-<n>. A watchdog process (not in that environment) holds
the read end of a pipe whose write end only this process holds; when this process exits,
however it exits (kill -9 included), the pipe closes and the watchdog SIGKILLs every
process whose environment carries the mark, and their descendants, then removes the
browser's profile directory. So no Chromium outlives the stage that started it. A crashed
browser is replaced by `restart()`; its tabs are gone, and `generation` tells an episode
that its tab belongs to a dead browser.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

from rlany.errors import RlanyError

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MARK = "RLANY_BROWSER"

# Runs in its own process: wait for the parent's pipe to close, then kill the marked processes.
_WATCHDOG = r"""
import os, shutil, signal, sys, time
mark, profile = sys.argv[1].encode(), sys.argv[2]
sys.stdin.buffer.read()
for _ in range(3):  # Chromium may fork while being killed: sweep a few times
    marked, parent = set(), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    marked.add(int(pid))
            with open(f"/proc/{pid}/stat") as f:
                parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    doomed, grew = set(marked), True
    while grew:  # and their descendants, marked or not
        grew = False
        for pid, ppid in parent.items():
            if ppid in doomed and pid not in doomed:
                doomed.add(pid)
                grew = True
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.2)
shutil.rmtree(profile, ignore_errors=True)
"""


WINDOW = (500, 400)  # the window's width and height in pixels (a click off it is refused)


def paths() -> tuple[str, str]:
    """(chromium, chromedriver), or a one-line error naming what is missing."""
    chrome = os.environ.get("MINIWOB_CHROME_BINARY") or CHROMIUM
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or CHROMEDRIVER
    missing = [p for p in (chrome, driver) if not os.access(p, os.X_OK)]
    if missing:
        raise RlanyError(f"the browser is not installed: {', '.join(missing)} not found",
                         hint="apt-get install chromium chromium-driver (`make install` does it "
                              "as root), or set MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER")
    return chrome, driver


def selenium():
    try:
        from selenium import webdriver
    except ImportError as e:
        raise RlanyError(f"the browser envs need selenium and miniwob ({e})",
                         hint="pip install 'rlany[gui]'") from e
    return webdriver


class Browser:
    """A headless Chromium with a pool of tabs; `generation` counts (re)starts."""

    def __init__(self) -> None:
        self.driver = None
        self.generation = 0
        self.restarts = 0
        self.free: list[str] = []  # tabs no episode holds (reused before opening new ones)
        self.urls: dict[str, str] = {}  # tab -> the page it shows
        self._watchdog: subprocess.Popen | None = None
        self._profile = ""

    @property
    def mark(self) -> str:
        return f"{os.getpid()}-{self.generation}"

    def start(self) -> None:
        chrome, driver_path = paths()
        webdriver = selenium()
        from selenium.webdriver.chrome.service import Service

        self.generation += 1
        self._profile = tempfile.mkdtemp(prefix="rlany-chromium-")
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, f"{MARK}={self.mark}", self._profile],
            stdin=subprocess.PIPE, start_new_session=True)
        options = webdriver.ChromeOptions()
        options.binary_location = chrome
        for arg in ("headless=new", "disable-gpu", "no-sandbox", "disable-dev-shm-usage",
                    "window-size={},{}".format(*WINDOW), "no-first-run", "disable-extensions",
                    f"user-data-dir={self._profile}"):
            options.add_argument(arg)
        env = {**os.environ, MARK: self.mark}
        try:
            self.driver = webdriver.Chrome(service=Service(driver_path, env=env), options=options)
        except Exception as e:
            self.stop()
            raise RlanyError(f"the browser did not start: {str(e).splitlines()[0][:200]}",
                             hint=f"try: {chrome} --headless=new --no-sandbox --dump-dom "
                                  "about:blank") from e
        self.free = [self.driver.current_window_handle]

    def stop(self) -> None:
        """Quit the browser (politely, then the watchdog kills whatever is left)."""
        if self.driver is not None:
            try:
                self.driver.quit()
            except Exception:  # a dead browser cannot be quit; the watchdog cleans up
                pass
        self.driver, self.free, self.urls = None, [], {}
        if self._watchdog is not None:
            self._watchdog.stdin.close()
            try:
                self._watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
            self._watchdog = None
        shutil.rmtree(self._profile, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def ensure(self):
        if self.driver is None:
            self.start()
        return self.driver

    def take_tab(self, url: str) -> str:
        """A tab showing `url` for one episode, switched to: a free one (one already at
        `url` first), else a new one."""
        driver = self.ensure()
        same = [h for h in self.free if self.urls.get(h) == url]
        handle = (same or self.free or [None])[-1]
        if handle is None:
            driver.switch_to.new_window("tab")
            handle = driver.current_window_handle
        else:
            self.free.remove(handle)
            driver.switch_to.window(handle)
        if self.urls.get(handle) != url:
            # a background tab has no focus, so focus events would never fire: emulate it
            driver.execute_cdp_cmd("Emulation.setFocusEmulationEnabled", {"enabled": True})
            driver.get(url)
            self.urls[handle] = url
        return handle

    def give_back(self, handle: str, generation: int) -> None:
        if generation == self.generation and self.driver is not None \
                and handle not in self.free:
            self.free.append(handle)


_BROWSER: Browser | None = None


def browser() -> Browser:
    """This process's browser (started by the first `ensure()`, stopped at exit)."""
    global _BROWSER
    if _BROWSER is None:
        _BROWSER = Browser()
        atexit.register(_BROWSER.stop)
    return _BROWSER
