// slug.js's acceptance tests (5), one `ok`/`not ok` line each. A module that does not load
// fails every test.
import assert from "node:assert/strict";

const mod = await import("../slug.js").catch((e) => ({ loadError: e }));
let n = 0;
function check(name, test) {
  n += 1;
  try {
    if (mod.loadError) throw mod.loadError;
    test();
    console.log(`ok ${n} - ${name}`);
  } catch (e) {
    console.log(`not ok ${n} - ${name}: ${String(e.message).split("\n")[0]}`);
  }
}

check("slugifies words and punctuation", () =>
  assert.equal(mod.slugify("Hello, World!"), "hello-world"));
check("collapses and trims separators", () =>
  assert.equal(mod.slugify("  many   spaces -- here "), "many-spaces-here"));
check("removes accents", () => assert.equal(mod.slugify("Crème brûlée"), "creme-brulee"));
check("leaves short text alone", () => assert.equal(mod.truncate("hello", 10), "hello"));
check("truncates with an ellipsis to max characters", () =>
  assert.equal(mod.truncate("hello world", 6), "hello…"));
