// Bundles the console into ../dist: app.js (src/main.ts and what it
// imports, the generated API code and @connectrpc/@bufbuild included),
// app.css and index.html. esbuild-wasm runs esbuild compiled to
// WebAssembly, so nothing platform-specific is installed; its output is
// deterministic (the same sources give the same bytes), which make verify
// relies on. No source maps: dist is committed and served as is.
import * as esbuild from "esbuild-wasm";
import { copyFile, mkdir, readdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, "..", "dist");

// Start from an empty dist so a file no longer built does not linger.
await mkdir(dist, { recursive: true });
for (const f of await readdir(dist)) await rm(join(dist, f), { recursive: true });

const common = {
  absWorkingDir: here,
  bundle: true,
  minify: true,
  legalComments: "eof",
  charset: "utf8",
  logLevel: "warning",
};

await esbuild.build({
  ...common,
  entryPoints: ["src/main.ts"],
  outfile: join(dist, "app.js"),
  format: "iife",
  platform: "browser",
  target: ["es2022", "chrome100", "firefox100", "safari15"],
});
await esbuild.build({
  ...common,
  entryPoints: ["static/app.css"],
  outfile: join(dist, "app.css"),
  target: ["chrome100", "firefox100", "safari15"],
});
await copyFile(join(here, "static", "index.html"), join(dist, "index.html"));
await esbuild.stop();
