// The console's shell: sign-in, navigation between pages (#/overview, #/keys, …), and the
// lifecycle of the page on screen (each page's mount returns a function that stops its timers).

import {admin, setToken, signOut, token, whenUnauthorized} from './api.js';
import {clear, errorBox, field, h} from './dom.js';
import * as overview from './pages/overview.js';
import * as keys from './pages/keys.js';
import * as usage from './pages/usage.js';
import * as models from './pages/models.js';
import * as playground from './pages/playground.js';

const PAGES = {overview, keys, usage, models, playground};
const main = document.getElementById('main');
const nav = document.getElementById('nav');
const signOutButton = document.getElementById('sign-out');
let unmount = () => {};

function showSignIn(reason) {
  unmount();
  unmount = () => {};
  nav.hidden = true;
  signOutButton.hidden = true;
  const input = h('input', {type: 'password', name: 'admin-token', autocomplete: 'off', required: true, spellcheck: 'false'});
  const status = h('div', {role: 'status'});
  const form = h('form', {class: 'card sign-in', id: 'sign-in'},
    h('h1', {}, 'Sign in'),
    h('p', {}, 'Paste the admin token the server was started with (', h('code', {}, '--admin-token'),
      ' or ', h('code', {}, 'GANTRY_ADMIN_TOKEN'), '). It stays in this tab only.'),
    reason ? errorBox(reason) : null,
    field('Admin token', input),
    h('button', {type: 'submit', class: 'primary'}, 'Sign in'),
    status);
  form.addEventListener('submit', async event => {
    event.preventDefault();
    setToken(input.value.trim());
    clear(status).append('Checking…');
    try {
      await admin('/stats');
      route();
    } catch (err) {
      signOut();
      clear(status).append(errorBox(err));
    }
  });
  clear(main).append(form);
  input.focus();
}

function route() {
  if (!token()) return showSignIn();
  const name = (location.hash.match(/^#\/(\w+)/) || [])[1];
  // Own pages only: `#/constructor` must not find Object.prototype's members.
  const page = Object.hasOwn(PAGES, name ?? '') ? PAGES[name] : undefined;
  if (!page) {
    location.replace('#/overview');
    return;
  }
  nav.hidden = false;
  signOutButton.hidden = false;
  for (const link of nav.querySelectorAll('a')) {
    if (link.dataset.page === name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  unmount();
  clear(main);
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · Gantry console`;
  unmount = page.mount(main) || (() => {});
  main.focus({preventScroll: true});
}

whenUnauthorized(err => {
  signOut();
  showSignIn(err);
});
signOutButton.addEventListener('click', () => {
  signOut();
  showSignIn();
});
window.addEventListener('hashchange', route);
route();
