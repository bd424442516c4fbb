"""`kem playground` in a real browser: Debian's headless Chromium drives the
page served by a real `kem playground` process (real wgpu on the machine's
adapter). A kernel typed with an error shows the diagnostic at its
line:column; fixed, it runs on random input and the hex the page shows is
numpy's answer; an image kernel on a PNG shows the image kem_port.api
computes. Screenshots go where tests/browser.py says (docs/screenshots/playground_*.png with KEM_SCREENSHOTS=docs/screenshots)
(docs/playground.md shows them)."""

from __future__ import annotations

import base64
import io
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from browser import browser, screenshot, wait_for  # noqa: F401  (browser: the module's driver fixture)
from conftest import playground_process, stopped_by

ROOT = Path(__file__).resolve().parents[1]
PIXELIZE = ROOT / "kem_port" / "kernels" / "pixelize.wgsl"
KERNEL = """@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) {
        return;
    }
    output_words[i] = (input_words[i] ^ 0x5a5a5a5au) * 7u + i;
}
"""
TYPO = KERNEL.replace("(input_words[i] ^", "(input_wrds[i] ^")


@pytest.fixture(scope="module")
def playground():
    """A `kem playground` process; its URL. SIGTERM must stop it cleanly (exit 0)."""
    proc = playground_process(KEM_LOG="WARNING")
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]+", line)  # the URL it prints carries its token
    assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
    try:
        yield found.group(0)
    finally:
        code, stderr = stopped_by(proc, signal.SIGTERM)
        assert code == 0 and "stopped" in stderr, stderr


def load(driver, url: str) -> None:
    driver.get(url)
    wait_for(driver, lambda d: d.find_element("id", "check-status").text.startswith("ok"))


def type_kernel(driver, text: str) -> None:
    """Select all in the editor and type the kernel, key by key, as an author would."""
    from selenium.webdriver.common.keys import Keys

    editor = driver.find_element("id", "code")
    editor.send_keys(Keys.CONTROL, "a")
    editor.send_keys(Keys.DELETE)
    editor.send_keys(text)
    assert editor.get_attribute("value") == text


def paste_kernel(driver, text: str) -> None:
    """A long kernel goes in as a paste does: the value set at once, one input
    event. The status is emptied first, so a wait for "ok: ..." waits for
    this kernel's check, not the page's first kernel's (whose "ok: a kem@1.0
    kernel" let a test fill the form while the new check redrew it: seen
    once as "element not interactable" in a clean-clone run)."""
    editor = driver.find_element("id", "code")
    driver.execute_script("document.getElementById('check-status').textContent = '';"
                          "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));", editor, text)


def set_field(element, value) -> None:
    element.clear()
    element.send_keys(str(value))


def shown_bytes(driver, name: str = "output") -> bytes:
    """The bytes the page's hex view shows for output `name` (offset, hex pairs, |ascii|)."""
    pre = driver.find_element("css selector", f".output[data-name='{name}'] pre.hex")
    data = bytearray()
    for line in pre.text.splitlines():
        found = re.match(r"[0-9a-f]{8}  ((?:[0-9a-f]{2} ?)+)\s+\|", line)
        if found:
            data += bytes.fromhex(found.group(1).replace(" ", ""))
    return bytes(data)


def run_and_wait(driver) -> None:
    driver.execute_script("document.getElementById('result').hidden = true; document.getElementById('run-status').textContent = '';")
    driver.find_element("id", "run").click()
    wait_for(driver, lambda d: d.find_element("id", "run-status").text in ("done", "failed"), timeout=60)
    assert driver.find_element("id", "run-status").text == "done", driver.find_element("id", "outputs").text


def fact(driver, name: str) -> str:
    terms = driver.find_elements("css selector", "#facts dt")
    values = driver.find_elements("css selector", "#facts dd")
    return next(v.text for t, v in zip(terms, values) if t.text == name)


def test_a_typed_error_is_shown_at_its_line_and_column_and_the_fixed_kernel_runs_as_numpy_says(browser, playground, rng):
    load(browser, playground)
    type_kernel(browser, TYPO)
    item = wait_for(browser, lambda d: d.find_elements("css selector", "#diagnostics li"))[0]
    line = next(n for n, text in enumerate(TYPO.splitlines(), 1) if "input_wrds" in text)
    col = TYPO.splitlines()[line - 1].index("input_wrds") + 1  # naga counts columns from 1
    assert (item.get_attribute("data-line"), item.get_attribute("data-col")) == (str(line), str(col))
    assert item.text.startswith(f"{line}:{col}") and "input_wrds" in item.text
    marked = browser.find_elements("css selector", "#gutter div.err")
    assert [m.text for m in marked] == [str(line)]
    assert browser.find_element("id", "check-status").text.startswith("error")
    screenshot(browser, "playground_error")

    type_kernel(browser, KERNEL)
    wait_for(browser, lambda d: d.find_element("id", "check-status").text == "ok: a kem@1.0 kernel")
    assert browser.find_elements("css selector", "#diagnostics li") == []
    names = [td.text for td in browser.find_elements("css selector", "#bindings tbody td:nth-child(3)")]
    assert names == ["input_words", "output_words"]

    for words in (int(rng.integers(1, 64)), int(rng.integers(300, 1024))):  # one workgroup, then several
        seed = int(rng.integers(0, 1 << 31))
        row = browser.find_element("css selector", "#input-spec .input-row")
        set_field(row.find_element("class name", "size"), words * 4)
        set_field(row.find_element("class name", "seed"), seed)
        run_and_wait(browser)
        x = np.frombuffer(np.random.default_rng(seed).bytes(words * 4), "<u4")
        want = ((x ^ np.uint32(0x5A5A5A5A)) * np.uint32(7) + np.arange(words, dtype=np.uint32)).astype("<u4").tobytes()
        assert shown_bytes(browser) == want[:4096]
        assert fact(browser, "dispatch rule") == "1-D"
        assert fact(browser, "workgroups") == f"{-(-words // 64)} x 1 x 1"
    assert fact(browser, "device").startswith("warm")  # one device for the server's life
    screenshot(browser, "playground_run")


def test_an_image_kernel_on_a_png_shows_the_image_the_api_computes(browser, playground, rng, tmp_path):
    from PIL import Image

    from kem_port import api

    width, height = int(rng.integers(20, 48)), int(rng.integers(12, 40))
    pixels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    png = tmp_path / "in.png"
    Image.fromarray(pixels, "RGBA").save(png)
    load(browser, playground)
    paste_kernel(browser, PIXELIZE.read_text())
    wait_for(browser, lambda d: d.find_element("id", "check-status").text == "ok: a kem@1.0 kernel")
    row = browser.find_element("css selector", "#input-spec .input-row")
    from selenium.webdriver.support.ui import Select

    Select(row.find_element("class name", "kind")).select_by_value("file")
    row.find_element("class name", "file").send_keys(str(png))
    set_field(browser.find_element("id", "params"), "w,h,4,0")
    run_and_wait(browser)

    want = api.run("pixelize", pixels.tobytes(), params=[width, height, 4, 0])
    img = browser.find_element("css selector", ".output[data-name='output'] img")
    src = img.get_attribute("src")
    assert src.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as shown:
        assert shown.size == (width, height)
        assert shown.convert("RGBA").tobytes() == want
    assert shown_bytes(browser) == want[:4096]
    assert fact(browser, "dispatch rule") == "image"
    assert fact(browser, "input") == f"{width * height * 4} bytes (PNG {width}x{height})"
    screenshot(browser, "playground_image")


ADD = """@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;

@compute @workgroup_size(32)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&c)) { c[gid.x] = a[gid.x] - 0.5 * b[gid.x]; }
}
"""


def test_a_kernel_outside_kem10_runs_by_named_buffers_from_the_form_reflection_draws(browser, playground, rng):
    from selenium.webdriver.support.ui import Select

    load(browser, playground)
    paste_kernel(browser, ADD)
    wait_for(browser, lambda d: d.find_element("id", "check-status").text == "ok: runs by named buffers")
    assert browser.find_element("id", "mode").get_attribute("value") == "named"
    rows = {r.get_attribute("data-name"): r for r in browser.find_elements("css selector", "#named-fields .input-row")}
    assert sorted(rows) == ["a", "b"]
    n = int(rng.integers(1, 1000))
    # Normal floats, typed as hex (random bytes as f32 hold NaNs, whose
    # payloads a GPU need not keep, and subnormals it may flush).
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    for name, values in (("a", a), ("b", b)):
        Select(rows[name].find_element("class name", "kind")).select_by_value("hex")
        set_field(rows[name].find_element("class name", "hex"), values.tobytes().hex())
    set_field(browser.find_element("css selector", "#named-fields label[data-name='c'] .out-size"), n * 4)
    Select(browser.find_element("id", "dispatch")).select_by_value("grid")
    set_field(browser.find_element("id", "dx"), n)
    run_and_wait(browser)
    assert shown_bytes(browser, "c") == (a - np.float32(0.5) * b).astype(np.float32).tobytes()[:4096]
    assert fact(browser, "dispatch rule") == "grid"
    screenshot(browser, "playground_named")


def test_debug_records_are_shown_beside_the_output(browser, playground, rng):
    from test_playground import SEVENS

    load(browser, playground)
    paste_kernel(browser, SEVENS)
    wait_for(browser, lambda d: d.find_element("id", "check-status").text not in ("", "checking…"), timeout=60)
    assert browser.find_element("id", "check-status").text == "ok: a kem@1.0 kernel", browser.find_element("id", "check-status").text
    words, seed = int(rng.integers(10, 500)), int(rng.integers(0, 1 << 31))
    row = browser.find_element("css selector", "#input-spec .input-row")
    set_field(row.find_element("class name", "size"), words * 4)
    set_field(row.find_element("class name", "seed"), seed)
    browser.find_element("id", "debug").click()
    run_and_wait(browser)
    x = np.frombuffer(np.random.default_rng(seed).bytes(words * 4), "<u4")
    found = re.fullmatch(r"(\d+) records, 0 dropped: ?([\d ]*)", browser.find_element("id", "debug-records").text)
    assert found, browser.find_element("id", "debug-records").text
    records = sorted(int(r) for r in found.group(2).split())
    assert int(found.group(1)) == len(records) and records == np.flatnonzero(x % 7 == 0).tolist()
    assert shown_bytes(browser) == (x + np.uint32(1)).astype("<u4").tobytes()[:4096]
    screenshot(browser, "playground_debug")
