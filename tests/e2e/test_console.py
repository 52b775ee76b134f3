"""The operator's console (/console) in headless Chromium, driven by Selenium: sign in, create a
key in the UI, use it through the openai SDK, see the request in the usage chart and table (and
its CSV, the same as `gantry usage --by-day --format csv`) and in the overview's counters, chat in
the playground, rotate and revoke the key in the UI and watch the old secrets get 401. Every page
is screenshotted into target/console-screenshots/ (GANTRY_UPDATE_DOCS=1 also copies them to
docs/console-*.png for docs/keys-and-billing.md), and any browser console error fails the test."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import openai
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from _util import REPO, gantry_bin, httpx
from conftest import _models, serving

ADMIN_TOKEN = "console-e2e-admin-token-0123456789"
SHOTS = REPO / "target" / "console-screenshots"
WAIT_S = 30


@pytest.fixture(scope="module")
def srv():
    model = _models()[0]
    # A price, so cost columns and USD budgets have something to show.
    price = f"{Path(model).stem}=0.5,1.5" if model.endswith(".gguf") else f"{model}=0.5,1.5"
    # A second, small model (unloaded until asked for) so the models page offers load and unload.
    extra = ("--admin-token", ADMIN_TOKEN, "--price", price, "--model", "small=smollm2-135m")
    with serving(model, extra) as (server, _client):
        yield server


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.fail("chromium and chromedriver are missing: run scripts/install-browser.sh (make test-e2e does)")
    shutil.rmtree(SHOTS, ignore_errors=True)
    profile = tempfile.mkdtemp(prefix="gantry-console-chromium-")
    downloads = tempfile.mkdtemp(prefix="gantry-console-downloads-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.add_experimental_option("prefs", {"download.default_directory": downloads, "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
    viewport(driver, 1280, 800)
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(downloads, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_console_errors(browser):
    """Fails the test on any error the page logged (uncaught exceptions, failed loads, CSP)."""
    browser.get_log("browser")  # what earlier tests left
    yield
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, f"browser console errors: {severe}"


# --- helpers -----------------------------------------------------------------------------------

def wait_for(driver, what, condition, timeout=WAIT_S):
    def check(d):
        try:
            return condition(d)
        except StaleElementReferenceException:
            return False
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(check)
    except Exception as e:
        shot(driver, "failure")
        raise AssertionError(f"timed out waiting for {what}; page text:\n{driver.find_element(By.TAG_NAME, 'main').text[:3000]}") from e


def viewport(driver, width, height):
    """The page's size exactly (a window size would include the browser's own bars)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 700})


def css(driver, selector):
    return driver.find_element(By.CSS_SELECTOR, selector)


def shot(driver, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"console-{name}.png"
    driver.save_screenshot(str(path))
    if os.environ.get("GANTRY_UPDATE_DOCS") == "1" and name in {"overview", "keys", "usage", "models", "playground", "signin"}:
        shutil.copyfile(path, REPO / "docs" / f"console-{name}.png")
    return path


def go(driver, page):
    """Follows a nav link (no reload: secrets created in this tab stay in its memory)."""
    css(driver, f'nav a[data-page="{page}"]').click()
    wait_for(driver, f"the {page} page", lambda d: d.find_element(By.TAG_NAME, "h1").text.lower() == page)


def figure(driver, name):
    return css(driver, f'[data-figure="{name}"] .value').text


def as_number(text):
    return float(text.split()[0].replace(",", "").rstrip("%"))


def key_row(driver, name):
    for row in driver.find_elements(By.CSS_SELECTOR, "#keys-list tbody tr"):
        if row.find_element(By.CSS_SELECTOR, "td").text == name:
            return row
    return None


def confirm(driver):
    wait_for(driver, "the confirmation dialog", lambda d: d.find_element(By.CSS_SELECTOR, "dialog.confirm button.danger").is_displayed())
    css(driver, "dialog.confirm button.danger").click()


def new_secret(driver, previous=None):
    return wait_for(driver, "a new secret", lambda d: (t := d.find_element(By.ID, "new-secret").text) and t != previous and t)


def admin_get(srv, path):
    r = httpx.get(f"{srv.root_url}/admin/v1{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    r.raise_for_status()
    return r.json()


def sdk(srv, secret):
    return openai.OpenAI(base_url=srv.base_url, api_key=secret, max_retries=0, timeout=120)


def ask(srv, secret, text="Say hello in three words."):
    with sdk(srv, secret) as c:
        return c.chat.completions.create(model=srv.model_id, max_tokens=8, temperature=0,
                                         messages=[{"role": "user", "content": text}])


def assert_refused(srv, secret):
    with pytest.raises(openai.AuthenticationError) as refused:
        ask(srv, secret)
    assert refused.value.status_code == 401


# --- the scenario ------------------------------------------------------------------------------

def test_sign_in_create_use_see_rotate_revoke(srv, browser):
    d = browser
    d.get(f"{srv.root_url}/console")
    headers = httpx.get(f"{srv.root_url}/console", timeout=30).headers
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"

    # Sign in.
    token_input = wait_for(d, "the sign-in form", lambda d: d.find_element(By.CSS_SELECTOR, "#sign-in input[type=password]"))
    shot(d, "signin")
    token_input.send_keys(ADMIN_TOKEN, Keys.ENTER)
    wait_for(d, "the overview", lambda d: d.find_elements(By.CSS_SELECTOR, '[data-figure="requests_total"]'))
    assert ADMIN_TOKEN not in d.current_url
    requests_before = as_number(figure(d, "requests_total"))
    # Background traffic on the server's other key, spread over a few samples, so the overview
    # has lines to draw and the usage chart a second key.
    load = threading.Thread(target=lambda: [(ask(srv, srv.api_key), time.sleep(1)) for _ in range(4)], daemon=True)
    load.start()

    # Create a key with limits and a budget; its secret is shown once.
    go(d, "keys")
    css(d, "#create-key").click()
    form = wait_for(d, "the key form", lambda d: d.find_element(By.CSS_SELECTOR, "dialog.key-form form"))
    form.find_element(By.NAME, "name").send_keys("console-e2e")
    form.find_element(By.NAME, "tenant").send_keys("acme")
    form.find_element(By.NAME, "rpm_limit").send_keys("600")
    form.find_element(By.NAME, "budget_tokens").send_keys("100000")
    Select(form.find_element(By.NAME, "cache_scope")).select_by_value("key")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    secret = new_secret(d)
    assert secret.startswith("sk-gantry-")
    row = wait_for(d, "the key in the list", lambda d: key_row(d, "console-e2e"))
    assert "acme" in row.text and "600 req/min" in row.text and "active" in row.text
    assert admin_get(srv, "/keys/console-e2e")["cache_scope"] == "key", "the form sets the prompt-cache scope"

    # Use it through the SDK; its spend shows against the budget.
    answer = ask(srv, secret)
    assert answer.usage.completion_tokens > 0
    spent = answer.usage.total_tokens
    go(d, "overview")
    go(d, "keys")
    wait_for(d, "the key's spend", lambda d: f"{spent} of 100,000 tokens" in key_row(d, "console-e2e").text)
    assert not d.find_elements(By.ID, "new-secret"), "the secret is shown once, not again"

    # Edit: a new RPM limit shows in the list.
    key_row(d, "console-e2e").find_element(By.CSS_SELECTOR, "button[aria-label='Edit console-e2e']").click()
    rpm = wait_for(d, "the edit form", lambda d: d.find_element(By.CSS_SELECTOR, "dialog.key-form input[name=rpm_limit]"))
    assert rpm.get_attribute("value") == "600"
    rpm.clear()
    rpm.send_keys("1200")
    css(d, "dialog.key-form button[type=submit]").click()
    wait_for(d, "the new limit", lambda d: "1,200 req/min" in key_row(d, "console-e2e").text)
    shot(d, "keys")

    # Usage: the request is in the chart and the table, and the CSV is the CLI's.
    load.join(timeout=120)
    assert not load.is_alive()
    go(d, "usage")
    table = wait_for(d, "the usage table row", lambda d: [r for r in d.find_elements(By.CSS_SELECTOR, "#usage-table tbody tr")
                                                          if "console-e2e" in r.text])
    cells = [c.text for c in table[0].find_elements(By.TAG_NAME, "td")]
    assert cells[1:6] == ["console-e2e", "acme", srv.model_id, "default", "—"] and cells[6] == "1", cells
    labels = [c.get_attribute("data-label") for c in table[0].find_elements(By.TAG_NAME, "td")]
    assert labels[labels.index("Completion tokens") + 1] == "Reasoning tokens", labels
    bars = d.find_elements(By.CSS_SELECTOR, "#usage-chart svg rect title")
    assert any("console-e2e" in b.get_attribute("textContent") for b in bars), "no bar for the key in the usage chart"
    Select(css(d, "select[name=stack_by]")).select_by_value("model")
    wait_for(d, "bars stacked by model", lambda d: any(srv.model_id in t.get_attribute("textContent")
                                                       for t in d.find_elements(By.CSS_SELECTOR, "#usage-chart svg rect title")))
    Select(css(d, "select[name=stack_by]")).select_by_value("service_tier")
    wait_for(d, "bars stacked by tier", lambda d: any("default" in t.get_attribute("textContent")
                                                      for t in d.find_elements(By.CSS_SELECTOR, "#usage-chart svg rect title")))
    Select(css(d, "select[name=stack_by]")).select_by_value("batch_id")
    wait_for(d, "bars stacked by batch", lambda d: any("(no batch)" in t.get_attribute("textContent")
                                                       for t in d.find_elements(By.CSS_SELECTOR, "#usage-chart svg rect title")))
    Select(css(d, "select[name=stack_by]")).select_by_value("key_name")
    wait_for(d, "bars stacked by key", lambda d: "by key" in d.find_element(By.CSS_SELECTOR, "#usage-chart figcaption").text)
    shot(d, "usage")
    # Filtered to the key, the other key's traffic is gone.
    assert "serve --api-key" in css(d, "#usage-table").text
    Select(css(d, "select[name=key_name]")).select_by_value("console-e2e")
    css(d, "#usage-filters button[type=submit]").click()
    wait_for(d, "the filtered table", lambda d: "serve --api-key" not in d.find_element(By.ID, "usage-table").text)
    assert "console-e2e" in css(d, "#usage-table").text
    Select(css(d, "select[name=key_name]")).select_by_value("")
    css(d, "#usage-filters button[type=submit]").click()
    wait_for(d, "the unfiltered table", lambda d: "serve --api-key" in d.find_element(By.ID, "usage-table").text)
    css(d, "#usage-csv").click()
    csv_path = wait_for(d, "the CSV download", lambda d: next((p for p in Path(d.downloads).glob("*.csv")), None))
    since = css(d, "input[name=since]").get_attribute("value")
    until = (dt.date.fromisoformat(css(d, "input[name=until]").get_attribute("value")) + dt.timedelta(days=1)).isoformat()
    cli = subprocess.run([gantry_bin(), "usage", "--data-dir", srv.data_dir, "--by-day", "--since", since, "--until", until,
                          "--format", "csv"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert csv_path.read_text() == cli
    assert "console-e2e,acme," in cli

    # Overview: the counters moved, and a sample with the request lands within a few seconds.
    go(d, "overview")
    wait_for(d, "requests_total to move", lambda d: as_number(figure(d, "requests_total")) > requests_before)
    assert as_number(figure(d, "tokens_total")) >= answer.usage.completion_tokens
    wait_for(d, "a requests/s sample", lambda d: as_number(figure(d, "requests_per_second")) > 0, timeout=20)
    wait_for(d, "a TTFT figure", lambda d: not figure(d, "ttft").startswith("—"))
    assert len(d.find_elements(By.CSS_SELECTOR, "#overview svg.chart")) >= 6
    # Several 5-second samples since the traffic began: the requests chart marks each one.
    wait_for(d, "four samples in the requests chart", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#overview svg.chart")[0]
                                                                  .find_elements(By.TAG_NAME, "circle")) >= 4, timeout=30)
    wait_for(d, "running sequences back to 0 when idle", lambda d: figure(d, "running_sequences") == "0")
    shot(d, "overview")

    # Models: both served models with state and throughput; load the small one, then unload it.
    go(d, "models")

    def model_row(d, model_id):
        return next((r for r in d.find_elements(By.CSS_SELECTOR, "#models-list tbody tr")
                     if r.find_element(By.TAG_NAME, "td").text == model_id), None)

    row = wait_for(d, "the model rows", lambda d: model_row(d, srv.model_id) and model_row(d, "small"))
    assert "loaded" in model_row(d, srv.model_id).text and "unloaded" in row.text
    legend = wait_for(d, "the per-model throughput chart", lambda d: d.find_elements(By.CSS_SELECTOR, "#models-chart .legend li"))
    assert [li.text for li in legend] == [srv.model_id, "small"]
    model_row(d, "small").find_element(By.CSS_SELECTOR, "button[aria-label='Load small']").click()
    wait_for(d, "small to load", lambda d: "unloaded" not in model_row(d, "small").text, timeout=120)
    assert admin_get(srv, "/models")["data"][1]["state"] == "loaded"
    shot(d, "models")
    model_row(d, "small").find_element(By.CSS_SELECTOR, "button[aria-label='Unload small']").click()
    wait_for(d, "small to unload", lambda d: "unloaded" in model_row(d, "small").text)
    assert admin_get(srv, "/models")["data"][1]["state"] == "unloaded"

    # Playground: chat through the key created above, streamed, with usage and cached tokens.
    go(d, "playground")
    wait_for(d, "models in the playground", lambda d: Select(d.find_element(By.NAME, "model")).options)
    Select(css(d, "select[name=key]")).select_by_visible_text("console-e2e (created in this tab)")
    for name, value in (("max_tokens", "8"), ("temperature", "0")):
        css(d, f"input[name={name}]").clear()
        css(d, f"input[name={name}]").send_keys(value)
    for question in ("Name a colour.", "And another one?"):
        css(d, "textarea[name=prompt]").send_keys(question)
        css(d, "#play-send").click()
        wait_for(d, "the answer's usage", lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .usage")
                 and d.find_elements(By.CSS_SELECTOR, ".msg.assistant .usage")[-1].text.startswith("Usage:"), timeout=120)
    usage_lines = d.find_elements(By.CSS_SELECTOR, ".msg.assistant .usage")
    assert len(usage_lines) == 2 and "cached" in usage_lines[-1].text
    # The second turn repeats the first as its prefix, so the prefix cache serves part of it.
    assert int(usage_lines[-1].get_attribute("data-cached-tokens")) > 0, usage_lines[-1].text
    assert all(m.text.split("\n", 1)[-1].strip() for m in d.find_elements(By.CSS_SELECTOR, ".msg.assistant .text"))
    shot(d, "playground")

    # Rotate in the UI: the old secret is refused, the new one works.
    go(d, "keys")
    wait_for(d, "the key row", lambda d: key_row(d, "console-e2e")).find_element(By.CSS_SELECTOR, "[data-action=rotate]").click()
    confirm(d)
    rotated = new_secret(d, previous=secret)
    assert_refused(srv, secret)
    assert ask(srv, rotated).choices[0].message.content is not None

    # Revoke in the UI: the rotated secret is refused too.
    key_row(d, "console-e2e").find_element(By.CSS_SELECTOR, "[data-action=revoke]").click()
    confirm(d)
    wait_for(d, "the key to show as revoked", lambda d: "revoked" in key_row(d, "console-e2e").text)
    assert_refused(srv, rotated)
    shot(d, "keys-revoked")


def test_phone_width_and_keyboard(srv, browser):
    d = browser
    viewport(d, 390, 844)
    try:
        for page in ("overview", "keys", "usage", "models", "playground"):
            d.get(f"{srv.root_url}/console#/{page}")
            wait_for(d, f"the {page} page", lambda d: d.find_element(By.TAG_NAME, "h1").text.lower() == page)
            # Its first data: the page is aria-busy while any admin call is in flight.
            wait_for(d, f"the {page} page's data", lambda d: d.execute_script(
                "return !document.getElementById('main').hasAttribute('aria-busy')"))
            overflow = d.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{page} scrolls sideways at phone width by {overflow}px"
            shot(d, f"{page}-phone")
        # Keyboard: the skip link comes first, then the navigation, each link reachable by Tab.
        d.get(f"{srv.root_url}/console#/overview")
        wait_for(d, "the overview", lambda d: d.find_elements(By.CSS_SELECTOR, '[data-figure="requests_total"]'))
        d.execute_script("document.querySelector('.skip').focus()")
        assert d.switch_to.active_element.text == "Skip to content"
        focused = []
        for _ in range(6):
            d.switch_to.active_element.send_keys(Keys.TAB)
            focused.append(d.switch_to.active_element.text)
        assert focused[:5] == ["Overview", "Keys", "Usage", "Models", "Playground"], focused
        d.switch_to.active_element.send_keys(Keys.SHIFT, Keys.TAB)  # back to Playground
        d.switch_to.active_element.send_keys(Keys.ENTER)
        wait_for(d, "the playground, opened from the keyboard", lambda d: d.find_element(By.TAG_NAME, "h1").text == "Playground")
    finally:
        viewport(d, 1280, 800)
