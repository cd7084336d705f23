// The page's entry: tabs (arrow keys move between them, as WAI-ARIA's tab pattern asks),
// the server's status, each protocol's panel, and the server's own figures.

import { setupChat, loadModels } from "./chat.js";
import { onKeyChange, watchHealth } from "./connection.js";
import { setupEvergreen } from "./evergreen.js";
import { setupSalience } from "./salience.js";
import { setupServer } from "./server.js";

const tabs = [...document.querySelectorAll('[role="tab"]')];

function select(tab) {
  for (const other of tabs) {
    const chosen = other === tab;
    other.setAttribute("aria-selected", String(chosen));
    other.tabIndex = chosen ? 0 : -1;
    document.getElementById(other.getAttribute("aria-controls")).hidden = !chosen;
  }
}

for (const [index, tab] of tabs.entries()) {
  tab.addEventListener("click", () => select(tab));
  tab.addEventListener("keydown", (event) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    if (step === undefined) return;
    const next = tabs[(index + step + tabs.length) % tabs.length];
    select(next);
    next.focus();
  });
}
const hashed = tabs.find((tab) => `#${tab.id.slice(4)}` === window.location.hash);
if (hashed) select(hashed);

const salience = setupSalience();
setupChat();
setupEvergreen();
setupServer();

watchHealth((up) => {
  const status = document.getElementById("server-status");
  status.textContent = up ? "server up" : "server unreachable, retrying…";
  status.classList.toggle("down", !up);
  if (up) {
    loadModels();
    salience.serverUp();
  }
});

onKeyChange(() => {
  loadModels();
  salience.keyChanged();
});
