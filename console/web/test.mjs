// Runs test/*.test.ts with node's test runner: esbuild-wasm bundles each
// into node_modules/.cache/console-test first (node 20 runs no TypeScript).
import * as esbuild from "esbuild-wasm";
import { readdir, rm } from "node:fs/promises";
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "node_modules", ".cache", "console-test");
await rm(out, { recursive: true, force: true });
const tests = (await readdir(join(here, "test"))).filter((f) => f.endsWith(".test.ts")).map((f) => join("test", f));
await esbuild.build({
  absWorkingDir: here,
  entryPoints: tests,
  outdir: out,
  outExtension: { ".js": ".mjs" },
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node20",
  logLevel: "warning",
});
await esbuild.stop();
const files = (await readdir(out)).map((f) => join(out, f));
const r = spawnSync(process.execPath, ["--test", "--test-reporter=spec", ...files], { stdio: "inherit" });
process.exit(r.status ?? 1);
