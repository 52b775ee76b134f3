// How numbers, sizes, durations and times are written across the console.

const integer = new Intl.NumberFormat('en', {maximumFractionDigits: 0});
const decimal = new Intl.NumberFormat('en', {maximumFractionDigits: 2});

export function num(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '—';
  return Math.abs(n) >= 100 || Number.isInteger(n) ? integer.format(n) : decimal.format(n);
}

export function usd(n) {
  if (n === null || n === undefined) return '—';
  return `$${n < 0.01 && n > 0 ? n.toPrecision(2) : n.toFixed(2)}`;
}

export function bytes(n) {
  if (!n) return '0 B';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** Seconds as ms or s. */
export function seconds(s) {
  if (s === null || s === undefined) return '—';
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

export function clock(ms) {
  return new Date(ms).toLocaleTimeString('en-GB', {hour: '2-digit', minute: '2-digit', second: '2-digit'});
}

/** RFC 3339 → `2027-01-01 00:00 UTC`. */
export function when(rfc3339) {
  if (!rfc3339) return '—';
  return `${rfc3339.replace('T', ' ').slice(0, 16)} UTC`;
}

/** YYYY-MM-DD of a Date, in UTC (the usage report's days are UTC days). */
export function isoDay(date) {
  return date.toISOString().slice(0, 10);
}
