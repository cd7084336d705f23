// Token texts (each id decoded alone with /detokenize, cached per model) and the colour
// scales of the token cells (logprob) and the readout heat map (signed value).

import { postJson, responseError } from "./connection.js";

const cache = new Map(); // `${model}\u0000${id}` -> Promise<string>

export function tokenText(model, id) {
  const key = `${model}\u0000${id}`;
  if (!cache.has(key)) {
    const text = (async () => {
      const response = await postJson("/detokenize", { model, tokens: [id] });
      if (!response.ok) {
        cache.delete(key);
        throw new Error(await responseError(response));
      }
      return (await response.json()).prompt;
    })();
    cache.set(key, text);
  }
  return cache.get(key);
}

// Whitespace made visible, so that a token that is a space or a newline still shows.
export function visible(text) {
  return text.replace(/\n/g, "\u21b5").replace(/\t/g, "\u2192").replace(/ /g, "\u00b7") || "\u2205";
}

// logprob 0 is green, -8 and below red: hue 120 down to 0.
export function logprobColour(logprob) {
  const t = Math.max(0, Math.min(1, 1 + logprob / 8));
  return `hsl(${Math.round(120 * t)} 70% 78%)`;
}

// Negative blue, positive red, white at 0; `scale` is the largest magnitude shown.
export function signedColour(value, scale) {
  const t = scale > 0 ? Math.max(-1, Math.min(1, value / scale)) : 0;
  const light = Math.round(97 - 45 * Math.abs(t));
  return t >= 0 ? `hsl(8 80% ${light}%)` : `hsl(218 80% ${light}%)`;
}
