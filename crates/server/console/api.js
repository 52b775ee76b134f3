// Calls to the admin API. The admin token lives in sessionStorage (this tab only, gone when it
// closes) and travels only in the Authorization header, never in a URL.

const TOKEN_KEY = 'gantry.adminToken';

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  secrets.clear();
}

/** Called when the admin API says the token is wrong (set by app.js to show the sign-in). */
let onUnauthorized = () => {};
export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

async function errorFrom(response) {
  let message = `${response.status} ${response.statusText}`;
  let code;
  try {
    const body = await response.json();
    if (body && body.error) {
      message = `${body.error.message} (HTTP ${response.status})`;
      code = body.error.code;
    }
  } catch (_) {
    // Not JSON: the status line is all there is to show.
  }
  return new ApiError(response.status, message, code);
}

/**
 * Admin calls in flight. While any is, the page (`#main`) is `aria-busy`: assistive technology
 * waits for the data before reading it out, and so can anything else that reads the page.
 */
let inFlight = 0;
function busy(delta) {
  inFlight += delta;
  const main = document.getElementById('main');
  if (!main) return;
  if (inFlight > 0) main.setAttribute('aria-busy', 'true');
  else main.removeAttribute('aria-busy');
}

/** A call to /admin/v1 + path; JSON in and out (text when `as: 'text'`). Throws ApiError. */
export async function admin(path, {method = 'GET', body, as = 'json'} = {}) {
  const headers = {Authorization: `Bearer ${token() || ''}`};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  busy(1);
  try {
    const response = await fetch(`/admin/v1${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
    if (!response.ok) {
      const err = await errorFrom(response);
      if (response.status === 401 || response.status === 403) onUnauthorized(err);
      throw err;
    }
    return as === 'text' ? await response.text() : await response.json();
  } finally {
    busy(-1);
  }
}

/** `?a=1&b=2` from the non-empty entries of an object. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : '';
}

/**
 * Secrets of keys created or rotated in this tab, by key id (as a string, like an option value),
 * so the playground can use them.
 * Memory only: a reload forgets them, as the server can never show a secret again.
 */
export const secrets = new Map();

export {errorFrom};
