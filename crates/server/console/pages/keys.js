// Keys: list with limits, budget and spend; create, edit, rotate, revoke.

import {admin, secrets} from '../api.js';
import {clear, confirmDialog, copyButton, errorBox, h, table} from '../dom.js';
import {num, usd, when} from '../format.js';
import {openKeyForm} from './key_form.js';

function limits(k) {
  const rpm = k.rpm_limit ? `${num(k.rpm_limit)} req/min` : 'any req/min';
  const tpm = k.tpm_limit ? `${num(k.tpm_limit)} tok/min` : 'any tok/min';
  return h('span', {}, rpm, h('br'), tpm);
}

/** One budget against its spend: a bar plus the same figures in words. */
function bar(spent, budget, format, unit) {
  const share = budget > 0 ? Math.min(1, spent / budget) : 0;
  const fill = h('span', {class: share >= 1 ? 'fill over' : 'fill'});
  fill.style.width = `${(share * 100).toFixed(1)}%`;
  return h('div', {class: 'budget'},
    h('span', {class: 'bar', role: 'img', 'aria-label': `${Math.round(share * 100)}% of the ${unit} budget`}, fill),
    h('span', {class: 'budget-text'}, `${format(spent)} of ${format(budget)} ${unit} (${Math.round(share * 100)}%)`));
}

function budget(k) {
  const spend = k.spend || {tokens: 0, usd: 0};
  const period = k.budget_period === 'month' ? 'this month' : 'in total';
  const parts = [];
  if (k.budget_tokens) parts.push(bar(spend.tokens, k.budget_tokens, num, 'tokens'));
  if (k.budget_usd) parts.push(bar(spend.usd, k.budget_usd, usd, 'USD'));
  if (!parts.length) parts.push(h('span', {}, `${num(spend.tokens)} tokens · ${usd(spend.usd)}, no budget`));
  return h('div', {}, parts, h('small', {class: 'muted budget-period'}, period));
}

export function mount(main) {
  const problem = h('div');
  const reveal = h('div', {'aria-live': 'polite'});
  const list = h('div', {id: 'keys-list'}, h('p', {class: 'muted'}, 'Loading…'));
  let servedModels = [];

  function showSecret(k, secret, verb) {
    secrets.set(String(k.id), {name: k.name, secret});
    clear(reveal).append(h('div', {class: 'secret card', role: 'status'},
      h('h2', {}, `${verb} ${k.name}: its secret, shown only this once`),
      h('p', {}, h('code', {id: 'new-secret'}, secret), ' ', copyButton(secret)),
      h('p', {class: 'muted'}, 'Keep it somewhere safe: the server stores only its hash. The playground can use it until this tab is reloaded.'),
      h('button', {type: 'button', onclick: () => clear(reveal)}, 'Done')));
  }

  async function act(work) {
    clear(problem);
    try {
      await work();
      await load();
    } catch (err) {
      problem.append(errorBox(err));
    }
  }

  function actions(k) {
    if (k.status === 'revoked') return h('span', {class: 'muted'}, `revoked ${when(k.revoked_at)}`);
    return h('div', {class: 'row-actions'},
      h('button', {type: 'button', 'aria-label': `Edit ${k.name}`, onclick: () => openKeyForm({key: k, servedModels,
        save: body => admin(`/keys/${k.id}`, {method: 'PATCH', body}).then(load)})}, 'Edit'),
      h('button', {type: 'button', 'aria-label': `Rotate ${k.name}`, dataset: {action: 'rotate', key: k.name}, onclick: () => act(async () => {
        if (!(await confirmDialog(`Rotate ${k.name}?`, 'The current secret stops working at once; a new one is shown once.', 'Rotate'))) return;
        const rotated = await admin(`/keys/${k.id}/rotate`, {method: 'POST'});
        showSecret(rotated, rotated.secret, 'Rotated');
      })}, 'Rotate'),
      h('button', {type: 'button', class: 'danger', 'aria-label': `Revoke ${k.name}`, dataset: {action: 'revoke', key: k.name}, onclick: () => act(async () => {
        if (!(await confirmDialog(`Revoke ${k.name}?`, 'Requests with this key will be refused from now on. This cannot be undone.', 'Revoke'))) return;
        await admin(`/keys/${k.id}`, {method: 'DELETE'});
        secrets.delete(String(k.id));
      })}, 'Revoke'));
  }

  async function load() {
    const keys = (await admin('/keys')).data;
    const rows = [...keys].sort((a, b) => (a.status === 'revoked') - (b.status === 'revoked') || a.name.localeCompare(b.name));
    clear(list).append(table([
      {label: 'Name', value: k => h('strong', {}, k.name)},
      {label: 'Tenant', value: k => k.tenant || '—'},
      {label: 'Prefix', value: k => h('code', {}, k.prefix)},
      {label: 'Limits', value: limits},
      {label: 'Budget and spend', value: budget},
      {label: 'Models', value: k => (k.models ? k.models.join(', ') : 'all')},
      {label: 'Prompt cache', value: k => k.cache_scope || 'tenant'},
      {label: 'Status', value: k => h('span', {class: `status ${k.status}`}, k.status, k.expires_at && k.status !== 'revoked' ? ` (expires ${when(k.expires_at)})` : '')},
      {label: 'Actions', value: actions},
    ], rows, `${keys.length} keys`));
  }

  const create = h('button', {type: 'button', class: 'primary', id: 'create-key', onclick: () => openKeyForm({key: null, servedModels,
    save: async body => {
      const created = await admin('/keys', {method: 'POST', body});
      showSecret(created, created.secret, 'Created');
      await load();
    }})}, 'Create key');

  main.append(h('div', {class: 'page-head'}, h('h1', {}, 'Keys'), create), problem, reveal, list);
  act(async () => {
    servedModels = (await admin('/models')).data.map(m => m.id);
  });
}
