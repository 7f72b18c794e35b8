// The sign-in page (/signin#CODE): takes the one-time code from the
// URL's fragment (browsers never send a fragment to the server), drops it
// from the address bar and the history entry at once, and exchanges it
// for a session cookie (POST /session). See docs/dashboard.md.
"use strict";

(async function signIn() {
  const status = document.getElementById("status");
  const say = (text) => { status.textContent = text; };
  const code = decodeURIComponent(location.hash.replace(/^#(code=)?/, ""));
  history.replaceState(null, "", "/signin");
  if (!code) {
    say("This page signs you in with the link `ramd dashboard` prints on the daemon's host: open that link (it works once, for 5 minutes).");
    return;
  }
  let res;
  try {
    res = await fetch("/session", {
      method: "POST",
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Content-Type": "application/json", "X-Ramd-Csrf": "1" },
      body: JSON.stringify({ code }),
    });
  } catch (e) {
    say("Could not reach the daemon: " + e);
    return;
  }
  if (res.ok) {
    location.replace("/");
    return;
  }
  let message = "sign-in refused (HTTP " + res.status + ")";
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) { /* not JSON: keep the status */ }
  say(message);
})();
