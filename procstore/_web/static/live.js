// Live updates without a reload: fetch this same page and swap in its <main>, which the
// server rendered (and escaped). Nothing else is fetched; nothing from the network.
// A static file, not an inline script: the Content-Security-Policy allows only scripts of
// this server's own origin, so nothing a store value could inject into the page ever runs.
"use strict";
(function () {
  async function refresh() {
    const said = document.getElementById("updated");
    try {
      const answer = await fetch(location.href, { cache: "no-store" });
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = page.getElementById("live");
      if (fresh) document.getElementById("live").replaceWith(fresh);
      said.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      said.textContent = "cannot reach procstore serve: " + e;
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    const every = Number(document.body.dataset.refreshMs);
    if (every > 0) setInterval(refresh, every);
  });
})();
