// Small DOM helpers: build elements node by node (nothing the server sends is ever parsed
// as HTML), and show errors where the operator sees them.

/** h('button', {class: 'primary', onclick: f}, 'Save') → <button class="primary">Save</button> */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'class') {
      el.className = value;
    } else if (name === 'dataset') {
      Object.assign(el.dataset, value);
    } else if (value === true) {
      el.setAttribute(name, '');
    } else {
      el.setAttribute(name, String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/** An alert box for a failed call: the API's own message, so the operator sees what went wrong. */
export function errorBox(err) {
  return h('div', {class: 'error', role: 'alert'}, h('strong', {}, 'Error: '), err && err.message ? err.message : String(err));
}

/** Replaces the contents of a status area (role=status, announced by screen readers). */
export function showStatus(el, ...children) {
  clear(el);
  append(el, children);
}

/** A labelled form field; `input` is the control element. */
export function field(label, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  return h('div', {class: 'field'}, h('label', {for: id}, label), input, hint ? h('small', {class: 'hint'}, hint) : null);
}

/** A table from column specs [{label, value: row => node|string, num}] and rows. */
export function table(columns, rows, caption) {
  const head = h('tr', {}, columns.map(c => h('th', {scope: 'col', class: c.num ? 'num' : null}, c.label)));
  const body = rows.map(r => h('tr', {}, columns.map(c => h('td', {class: c.num ? 'num' : null, 'data-label': c.label}, c.value(r)))));
  return h('div', {class: 'table-wrap'},
    h('table', {}, caption ? h('caption', {}, caption) : null, h('thead', {}, head), h('tbody', {}, body)));
}

/** Asks for confirmation in a modal dialog; resolves true when confirmed. */
export function confirmDialog(title, message, confirmLabel) {
  return new Promise(resolve => {
    const dialog = h('dialog', {class: 'confirm', 'aria-labelledby': 'confirm-title'},
      h('h2', {id: 'confirm-title'}, title),
      h('p', {}, message),
      h('div', {class: 'actions'},
        h('button', {type: 'button', class: 'danger', onclick: () => dialog.close('yes')}, confirmLabel),
        h('button', {type: 'button', onclick: () => dialog.close('no'), autofocus: true}, 'Cancel')));
    dialog.addEventListener('close', () => {
      dialog.remove();
      resolve(dialog.returnValue === 'yes');
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** A button that copies `text` and says so. */
export function copyButton(text, label = 'Copy') {
  const button = h('button', {type: 'button', class: 'copy'}, label);
  button.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = 'Copied';
    } catch (err) {
      // Clipboard access can be refused (plain http on another host); select the text instead.
      const code = button.parentElement && button.parentElement.querySelector('code');
      if (code) window.getSelection().selectAllChildren(code);
      button.textContent = 'Select and copy (Ctrl+C)';
    }
  });
  return button;
}
