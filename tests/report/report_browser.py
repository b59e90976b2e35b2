"""Headless Chromium for the report tests (Debian's chromium + chromium-driver, driven by selenium).

`open_browser()` returns a WebDriver or raises Unavailable with the reason (no selenium, no
browser binary, the driver would not start); the fixture turns that into a skip outside CI and
a failure in CI (the CI script installs the browser, so a missing one there is a broken setup).
"""
from __future__ import annotations

import os
import shutil
import tempfile

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
DRIVER = ("/usr/bin/chromedriver",)
# what this machine's closed network needs: no background connections, no first-run work
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


class Unavailable(Exception):
    pass


def _first(paths):
    return next((p for p in paths if os.path.isfile(p) and os.access(p, os.X_OK)), None)


def open_browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise Unavailable("selenium is not installed (pip install -e '.[test]')") from None
    binary, driver = _first(CHROMIUM), _first(DRIVER) or shutil.which("chromedriver")
    if not binary or not driver:
        raise Unavailable("no chromium/chromedriver (apt-get install -y chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="tdbg-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        browser = webdriver.Chrome(service=Service(driver), options=options)
    except Exception as e:   # selenium's WebDriverException and OS errors alike: say why and skip
        shutil.rmtree(profile, ignore_errors=True)
        raise Unavailable(f"chromium did not start: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    browser.tdbg_profile = profile
    return browser


def close_browser(browser) -> None:
    browser.quit()
    shutil.rmtree(browser.tdbg_profile, ignore_errors=True)


def png_colours(png: bytes, max_rows: int = 300) -> set:
    """The distinct pixel values in the first `max_rows` rows of an 8-bit, non-interlaced PNG
    (what Chromium's screenshots are), decoded here so no imaging library is needed."""
    import struct
    import zlib
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    width, height, depth, colour_type, _c, _f, interlace = header
    assert depth == 8 and interlace == 0, f"unexpected PNG format {header}"
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    raw, stride = zlib.decompress(idat), width * bpp
    previous, colours = bytearray(stride), set()
    for row in range(min(height, max_rows)):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        colours.update(bytes(line[i:i + bpp]) for i in range(0, stride, bpp * 7))   # every 7th pixel
        previous = line
    return colours
