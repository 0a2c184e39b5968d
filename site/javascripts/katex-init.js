// Render math with the vendored KaTeX (no CDN). Markdown pages: pymdownx.arithmatex wraps each
// formula in <span|div class="arithmatex"> with \( \) or \[ \] delimiters. Notebook pages:
// markdown cells keep Jupyter's $ / $$ delimiters.
document$.subscribe(function () {
  var tex = [
    { left: "\\[", right: "\\]", display: true },
    { left: "\\(", right: "\\)", display: false },
  ];
  var jupyter = [{ left: "$$", right: "$$", display: true }, { left: "$", right: "$", display: false }].concat(tex);
  document.querySelectorAll(".arithmatex").forEach(function (el) {
    renderMathInElement(el, { delimiters: tex, throwOnError: false });
  });
  document.querySelectorAll(".jupyter-wrapper .jp-RenderedMarkdown, .jupyter-wrapper .jp-MarkdownOutput").forEach(function (el) {
    renderMathInElement(el, { delimiters: jupyter, throwOnError: false });
  });
});
