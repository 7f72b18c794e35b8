#!/usr/bin/python3
"""Drives the ramd dashboard in Debian's headless chromium (selenium and
chromium-driver) for tests/dashboard.rs, which starts the daemon, makes the
links with `ramd dashboard` and checks the daemon's side afterwards.

  /usr/bin/python3 tests/browser/dashboard.py PLAN.json

PLAN (written by the Rust test): read_only_url, admin_url, base_url, spki
(the server certificate's SPKI SHA-256, base64, trusted for this run
only), drives, caches (names the page must list), io_uri (an NBD URI to
write to while watching the IOPS chart), io_drive, cache_uri (the first
cache's URI, read again and again for hits), persistent and
persistent_uri (a drive made dirty, then synced through the page),
new_drive (to create with the admin link), refused_drive (the read-only
link's attempt), bench_targets (names the benchmark table must show;
empty: no results expected), markup (HTML in the cache's backing path and
a bench target's name, which the page must show as text), short_link (the
command that prints a dashboard URL whose token expires in seconds), cli
(the ramd command aimed at the daemon's unix socket: links, revocation),
out_dir (for the screenshots).

Every wait is bounded (WAIT_S) and fails with what it waited for; nothing
is timed. Prints one JSON line of observations at the end.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading

import nbd
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException, StaleElementReferenceException, TimeoutException)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 60


def browser(plan, user_data):
    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    # Without the background-networking flags chromium's own connections
    # (updates, field trials) hang on this closed network.
    for a in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync",
        "--disable-default-apps", "--disable-extensions",
        "--user-data-dir=" + user_data, "--window-size=1400,1000",
        # Trust the test's server certificate, and only it.
        "--ignore-certificate-errors-spki-list=" + plan["spki"],
    ]:
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def wait(d, what, cond):
    try:
        ignored = (NoAlertPresentException, StaleElementReferenceException)
        return WebDriverWait(d, WAIT_S, poll_frequency=0.2, ignored_exceptions=ignored).until(
            lambda _: cond())
    except TimeoutException:
        notice = d.execute_script("return document.querySelector('#notice')?.textContent")
        raise AssertionError(f"waited {WAIT_S} s for {what}; page notice: {notice!r}; url {d.current_url}")


def row(d, table, name):
    rows = d.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-name='{name}']")
    return rows[0] if rows else None


def notice(d):
    return d.execute_script(
        "const n = document.querySelector('#notice');"
        "return n.hidden ? null : {kind: n.className, text: n.textContent};")


def legend(d, metric, series):
    return d.execute_script(
        "const li = document.querySelector(`figure[data-metric='${arguments[0]}'] li[data-series='${arguments[1]}']`);"
        "return li ? {value: li.dataset.value, peak: Number(li.dataset.peak), points: Number(li.dataset.points)} : null;",
        metric, series)


def screenshot(d, path):
    """The whole page (the window grown to its height, twice: the first
    resize may reflow it)."""
    for _ in range(2):
        height = d.execute_script("return document.documentElement.scrollHeight")
        d.set_window_size(1400, max(1000, height + 140))
    d.save_screenshot(path)
    d.set_window_size(1400, 1000)


def open_link(d, url, base, role):
    d.get(url)
    wait(d, f"the {role} page", lambda: d.find_element(By.ID, "role").text.startswith(role))
    # The page exchanged the link's one-time code for a session cookie,
    # and the code left the address bar (and history).
    wait(d, "the sign-in page to open the dashboard", lambda: d.current_url == base)
    assert "#" not in d.current_url and "signin" not in d.current_url
    assert d.execute_script("return document.cookie") == "", "the session cookie is visible to scripts (not HttpOnly)"
    cookies = d.get_cookies()
    assert any(c["name"].startswith("__Host-ramd_") and c["httpOnly"] and c["sameSite"] == "Strict" for c in cookies), cookies
    assert not any(c["value"].startswith("ramd_") for c in cookies), "a token in a cookie"
    return cookies


def write_until(uri, stop):
    """Writes 64 KiB blocks across the drive until `stop`."""
    h = nbd.NBD()
    h.connect_uri(uri)
    block = os.urandom(65536)
    size = h.get_size()
    offset = 0
    while not stop.is_set():
        h.pwrite(block, offset)
        offset = (offset + len(block)) % (size - len(block))
    h.shutdown()


def write_once(uri, length):
    """Writes `length` random bytes at the start (dirty data to sync)."""
    h = nbd.NBD()
    h.connect_uri(uri)
    h.pwrite(os.urandom(length), 0)
    h.shutdown()


def reread_until(uri, stop):
    """Writes 1 MiB through the cache, then reads it again and again
    (cache hits) until `stop`."""
    h = nbd.NBD()
    h.connect_uri(uri)
    h.pwrite(os.urandom(1 << 20), 0)
    while not stop.is_set():
        for offset in range(0, 1 << 20, 65536):
            h.pread(65536, offset)
    h.shutdown()


def shown_as_text(d, plan, seen, section):
    """The markup in user-controlled names is text in `section`: no element
    was made from it (the CSP would stop its script anyway; this checks the
    page never parses data as HTML)."""
    markup = plan["markup"]
    made = d.execute_script(
        "return document.querySelectorAll(arguments[0] + ' td img, ' + arguments[0] + ' td b, ' + arguments[0] + ' p img').length;",
        section)
    assert made == 0, f"{made} elements made from names in {section}"
    assert d.execute_script("return window.pwned === undefined")
    texts = d.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' td, ' + arguments[0] + ' p')).map(e => e.textContent);",
        section)
    assert any(markup in t for t in texts), f"{markup!r} not shown as text in {section}: {texts}"
    seen["markup_as_text"] = seen.get("markup_as_text", 0) + 1


def read_only_session(d, plan, seen):
    cookies = open_link(d, plan["read_only_url"], plan["base_url"], "read-only")
    seen["cookie_secure"] = all(c["secure"] for c in cookies if c["name"].startswith("__Host-ramd_"))
    for name in plan["drives"]:
        wait(d, f"drive {name} in the overview", lambda: row(d, "drive-table", name))
    for name in plan["caches"]:
        wait(d, f"cache {name} in the overview", lambda: row(d, "cache-table", name))
    seen["drive_rows"] = [r.get_attribute("data-name") for r in d.find_elements(By.CSS_SELECTOR, "#drive-table tbody tr")]
    create = d.find_element(By.CSS_SELECTOR, "#create-drive button[type=submit]")
    assert not create.is_enabled(), "the create button is enabled for a read-only session"
    assert d.find_element(By.ID, "read-only-note").is_displayed()
    seen["read_only_buttons_disabled"] = all(not b.is_enabled() for b in d.find_elements(By.CSS_SELECTOR, ".admin-action"))
    shown_as_text(d, plan, seen, "#caches")
    screenshot(d, os.path.join(plan["out_dir"], "dashboard-read-only.png"))
    # A user who gets around the disabled button: the server refuses, the
    # page says so.
    d.execute_script("for (const b of document.querySelectorAll('.admin-action')) b.disabled = false;")
    form = d.find_element(By.ID, "create-drive")
    form.find_element(By.NAME, "name").send_keys(plan["refused_drive"])
    form.find_element(By.NAME, "size").send_keys("1M")
    create.click()
    n = wait(d, "the refusal of the read-only create", lambda: notice(d))
    assert n["kind"] == "error" and "Refused" in n["text"] and "read-only" in n["text"], n
    seen["read_only_refusal"] = n["text"]


def chart_updates(d, plan, seen):
    drive = plan["io_drive"]
    wait(d, "the IOPS chart to plot the drive", lambda: legend(d, "iops", drive))
    before = legend(d, "iops", drive)
    assert before["peak"] == 0, f"IOPS before any I/O: {before}"
    write_once(plan["persistent_uri"], 4 << 20)
    stop = threading.Event()
    workers = [threading.Thread(target=write_until, args=(plan["io_uri"], stop)),
               threading.Thread(target=reread_until, args=(plan["cache_uri"], stop))]
    for w in workers:
        w.start()
    peak = lambda metric, series: (legend(d, metric, series) or {}).get("peak", 0)
    try:
        wait(d, f"the IOPS chart to show I/O on {drive}", lambda: peak("iops", drive) > 0)
        wait(d, f"the throughput chart to show I/O on {drive}", lambda: peak("mibs", drive) > 0)
        wait(d, f"the latency chart to show I/O on {drive}", lambda: peak("latency", drive + " p99") > 0)
        cache = plan["caches"][0]
        wait(d, f"the hit ratio chart to show hits on {cache}", lambda: peak("hits", cache) > 0)
        wait(d, f"the hit ratio chart to show {cache}'s ratio since it was made",
             lambda: peak("hits", cache + " overall") > 0)
        keep = plan["persistent"]
        wait(d, f"the dirty chart to show {keep}'s unsynced data", lambda: peak("dirty", keep) >= 4)
    finally:
        stop.set()
        for w in workers:
            w.join()
    seen["iops_peak"] = peak("iops", drive)
    seen["hit_ratio_peak"] = peak("hits", plan["caches"][0])
    seen["dirty_peak_mib"] = peak("dirty", plan["persistent"])
    seen["chart_updates"] = int(d.find_element(By.CSS_SELECTOR, "figure[data-metric='iops']").get_attribute("data-updates"))


def hit_ratio_chart(d, plan, seen):
    """A page opened after the cache's I/O shows its hit ratio since it
    was made at once; more reads draw a line of per-second ratios (at
    least two points: a line, not a dot)."""
    cache = plan["caches"][0]
    points = lambda series: (legend(d, "hits", series) or {}).get("points", 0)
    wait(d, f"the hit ratio chart to plot {cache} since it was made", lambda: points(cache + " overall") > 0)
    seen["hit_ratio_overall"] = float(legend(d, "hits", cache + " overall")["value"])
    stop = threading.Event()
    reader = threading.Thread(target=reread_until, args=(plan["cache_uri"], stop))
    reader.start()
    try:
        wait(d, f"two per-second points of {cache}'s hit ratio", lambda: points(cache) >= 2)
    finally:
        stop.set()
        reader.join()
    seen["hit_ratio_points"] = points(cache)


def admin_session(d, plan, seen):
    open_link(d, plan["admin_url"], plan["base_url"], "admin")
    hit_ratio_chart(d, plan, seen)
    name = plan["new_drive"]
    form = d.find_element(By.ID, "create-drive")
    form.find_element(By.NAME, "name").send_keys(name)
    form.find_element(By.NAME, "size").send_keys("8M")
    form.find_element(By.CSS_SELECTOR, "select[name=compress] option[value=lz4]").click()
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    n = wait(d, f"the page to say {name} was created", lambda: (notice(d) or {}).get("kind") == "ok" and notice(d))
    assert f"'{name}' created" in n["text"], n
    tr = wait(d, f"{name} in the overview", lambda: row(d, "drive-table", name))
    assert "compressed lz4" in tr.text, tr.text
    # Resize through the prompt.
    tr.find_element(By.CSS_SELECTOR, "[data-action=resize]").click()
    alert = wait(d, "the resize prompt", lambda: d.switch_to.alert)
    alert.send_keys("16M")
    alert.accept()
    wait(d, f"{name} to be 16 MiB", lambda: "16.0 MiB" in (row(d, "drive-table", name) or tr).text)
    # Sync the persistent drive.
    keep = row(d, "drive-table", plan["persistent"])
    keep.find_element(By.CSS_SELECTOR, "[data-action=sync]").click()
    n = wait(d, "the sync to finish", lambda: "synced" in ((notice(d) or {}).get("text") or "") and notice(d))
    assert n["kind"] == "ok" and "generation 0," not in n["text"], n
    seen["sync_notice"] = n["text"]
    wait(d, f"the dirty chart to show {plan['persistent']} clean again",
         lambda: legend(d, "dirty", plan["persistent"])["value"] == "0")
    # Push a snapshot through the drive's button (one remote: no prompt).
    snap = row(d, "drive-table", plan["snapshot_drive"])
    snap.find_element(By.CSS_SELECTOR, "[data-action=snapshot]").click()
    n = wait(d, "the snapshot to start", lambda: "started (job" in ((notice(d) or {}).get("text") or "") and notice(d))
    assert n["kind"] == "ok", n
    seen["snapshot_notice"] = n["text"]
    # Delete a drive through its button and the confirmation.
    scrap = plan["delete_drive"]
    tr = wait(d, f"{scrap} in the overview", lambda: row(d, "drive-table", scrap))
    tr.find_element(By.CSS_SELECTOR, "[data-action=delete]").click()
    alert = wait(d, "the delete confirmation", lambda: d.switch_to.alert)
    seen["delete_confirm"] = alert.text
    alert.accept()
    n = wait(d, f"the page to say {scrap} was deleted", lambda: "deleted" in ((notice(d) or {}).get("text") or "") and notice(d))
    seen["delete_notice"] = n["text"]
    wait(d, f"{scrap} to leave the overview", lambda: row(d, "drive-table", scrap) is None)


def bench_section(d, plan, seen):
    targets = plan["bench_targets"]
    if not targets:
        wait(d, "the no-results note", lambda: d.find_element(By.ID, "bench-empty").is_displayed())
        seen["bench"] = "empty"
        return
    wait(d, "the benchmark table", lambda: d.find_elements(By.CSS_SELECTOR, "#bench-table tbody tr"))
    shown = {r.get_attribute("data-target") for r in d.find_elements(By.CSS_SELECTOR, "#bench-table tbody tr")}
    assert set(targets) <= shown, f"bench targets shown: {shown}, expected {targets}"
    wait(d, "the benchmark plot to render", lambda: d.execute_script(
        "const i = document.querySelector('#bench-plot'); return i.complete && i.naturalWidth > 0;"))
    shown_as_text(d, plan, seen, "#bench")
    seen["bench"] = sorted(shown)


def expired_session(d, plan, seen):
    """A link whose token expires while the page is open: the page says
    the session expired (the next refresh gets 401 token_expired)."""
    url = subprocess.run(plan["short_link"], check=True, capture_output=True,
                         text=True).stdout.strip().splitlines()[-1]
    d.get(url)
    n = wait(d, "the page to say the session expired",
             lambda: "expired" in ((notice(d) or {}).get("text") or "") and notice(d))
    assert n["kind"] == "error" and "ramd dashboard" in n["text"], n
    seen["expired_notice"] = n["text"]


def revoked_session(d, plan, seen):
    """A session whose token is revoked while the page is open: the live
    stream ends at once (an `ended` event) and the page says offline and
    that the session ended, without a reload."""
    url = subprocess.run(plan["cli"] + ["dashboard"], check=True, capture_output=True,
                         text=True).stdout.strip().splitlines()[-1]
    open_link(d, url, plan["base_url"], "read-only")
    wait(d, "the live stream", lambda: d.find_element(By.ID, "live").text == "live")
    name = d.find_element(By.ID, "role").text.split("\u00b7")[-1].strip()
    assert name.startswith("dashboard-"), name
    subprocess.run(plan["cli"] + ["token", "revoke", name], check=True, capture_output=True)
    wait(d, "the page to go offline", lambda: d.find_element(By.ID, "live").text == "offline")
    n = wait(d, "the page to say the session ended",
             lambda: "ended" in ((notice(d) or {}).get("text") or "") and notice(d))
    seen["revoked_notice"] = n["text"]


def main():
    plan = json.load(open(sys.argv[1]))
    seen = {}
    with tempfile.TemporaryDirectory(prefix="ramd-chromium-") as user_data:
        d = browser(plan, user_data)
        try:
            read_only_session(d, plan, seen)
            chart_updates(d, plan, seen)
            admin_session(d, plan, seen)
            bench_section(d, plan, seen)
            # The admin page after all of it: the picture to look at.
            screenshot(d, os.path.join(plan["out_dir"], "dashboard.png"))
            revoked_session(d, plan, seen)
            expired_session(d, plan, seen)
            # Script errors (answers the test asked for, such as the 403,
            # are logged as network errors and are not counted).
            errors = [l for l in d.get_log("browser")
                      if l["level"] == "SEVERE" and l.get("source") != "network"]
            seen["console_errors"] = [l["message"] for l in errors]
        except Exception:
            try:
                screenshot(d, os.path.join(plan["out_dir"], "dashboard-failed.png"))
            finally:
                raise
        finally:
            d.quit()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
