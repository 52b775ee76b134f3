// The create/edit key form, in a modal dialog: every setting `gantry keys create` takes.

import {errorBox, field, h} from '../dom.js';

const SETTINGS = [
  {name: 'tenant', label: 'Tenant', type: 'text', hint: 'Groups keys for reports, e.g. a customer or team.'},
  {name: 'rpm_limit', label: 'Requests per minute', type: 'number', hint: 'Empty: unlimited (or the server default).'},
  {name: 'tpm_limit', label: 'Tokens per minute', type: 'number', hint: 'Empty: unlimited (or the server default).'},
  {name: 'budget_tokens', label: 'Token budget', type: 'number', hint: 'Prompt plus completion tokens. Empty: none.'},
  {name: 'budget_usd', label: 'Money budget (USD)', type: 'number', step: '0.01', hint: 'At the prices given to serve --price. Empty: none.'},
];

function input(setting, value) {
  const attrs = {name: setting.name, type: setting.type, value: value ?? ''};
  if (setting.type === 'number') Object.assign(attrs, {min: setting.step ? '0.01' : '1', step: setting.step || '1', inputmode: 'decimal'});
  return h('input', attrs);
}

function parsed(setting, raw) {
  const text = raw.trim();
  if (text === '') return null;
  return setting.type === 'number' ? Number(text) : text;
}

function modelList(raw) {
  const list = raw.split(',').map(m => m.trim()).filter(Boolean);
  return list.length ? list : null;
}

function same(a, b) {
  return JSON.stringify(a ?? null) === JSON.stringify(b ?? null);
}

/**
 * Opens the form. `key`: the key to edit, or null to create one. `servedModels`: ids for the
 * hint. `save(body)` sends it and resolves when done; its error is shown in the form.
 */
export function openKeyForm({key, servedModels, save}) {
  const editing = Boolean(key);
  const name = h('input', {name: 'name', type: 'text', required: !editing, value: key ? key.name : '', autocomplete: 'off'});
  const inputs = SETTINGS.map(s => [s, input(s, key ? key[s.name] : '')]);
  const period = h('select', {name: 'budget_period'},
    h('option', {value: 'total', selected: !key || key.budget_period === 'total'}, 'Lifetime of the key'),
    h('option', {value: 'month', selected: key && key.budget_period === 'month'}, 'Each calendar month (UTC)'));
  // Whose cached prompt prefixes the key's requests reuse; the server's default is the tenant.
  const scope = (key && key.cache_scope) || 'tenant';
  const cacheScope = h('select', {name: 'cache_scope'},
    h('option', {value: 'tenant', selected: scope === 'tenant'}, 'Its tenant (every key of the tenant)'),
    h('option', {value: 'key', selected: scope === 'key'}, 'This key alone'),
    h('option', {value: 'shared', selected: scope === 'shared'}, 'Shared with every shared key'));
  const models = h('input', {name: 'models', type: 'text', value: key && key.models ? key.models.join(', ') : '', autocomplete: 'off'});
  const expires = h('input', {name: 'expires_at', type: 'date', value: key && key.expires_at ? key.expires_at.slice(0, 10) : ''});
  const problem = h('div');
  const submit = h('button', {type: 'submit', class: 'primary'}, editing ? 'Save changes' : 'Create key');
  const dialog = h('dialog', {class: 'key-form', 'aria-labelledby': 'key-form-title'});
  const form = h('form', {method: 'dialog'},
    h('h2', {id: 'key-form-title'}, editing ? `Edit key ${key.name}` : 'Create a key'),
    field('Name', name),
    inputs.map(([s, el]) => field(s.label, el, s.hint)),
    field('Budget period', period),
    field('Allowed models', models, `Comma-separated; empty allows every model. Served: ${servedModels.join(', ') || '—'}.`),
    field('Expires on', expires, 'Midnight UTC of that day; empty: never.'),
    field('Prompt cache', cacheScope, 'Whose cached prompts this key reuses; cache hits show in usage and speed.'),
    problem,
    h('div', {class: 'actions'}, submit, h('button', {type: 'button', onclick: () => dialog.close()}, 'Cancel')));
  dialog.append(form);

  form.addEventListener('submit', async event => {
    event.preventDefault();
    const body = {};
    if (name.value.trim() && (!editing || name.value.trim() !== key.name)) body.name = name.value.trim();
    for (const [s, el] of inputs) {
      const value = parsed(s, el.value);
      if (!editing ? value !== null : !same(value, key[s.name])) body[s.name] = value;
    }
    if (!editing || period.value !== key.budget_period) body.budget_period = period.value;
    if (!editing ? cacheScope.value !== 'tenant' : cacheScope.value !== scope) body.cache_scope = cacheScope.value;
    const allowed = modelList(models.value);
    if (!editing ? allowed !== null : !same(allowed, key.models)) body.models = allowed;
    const expiry = expires.value ? expires.value : null;
    if (!editing ? expiry !== null : !same(expiry, key.expires_at ? key.expires_at.slice(0, 10) : null)) body.expires_at = expiry;
    submit.disabled = true;
    problem.replaceChildren();
    try {
      await save(body);
      dialog.close();
    } catch (err) {
      problem.append(errorBox(err));
    } finally {
      submit.disabled = false;
    }
  });
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  name.focus();
  return dialog;
}
