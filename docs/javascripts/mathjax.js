// MathJax 3 configuration for pymdownx.arithmatex (generic mode): typeset only the
// elements arithmatex marks, with the \( \) and \[ \] delimiters it writes. MathJax itself
// (tex-svg.js, loaded after this file) is shipped with the site in javascripts/mathjax/ and
// loads what it needs on demand (TeX extensions) from there: no network.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
  svg: {
    fontCache: "global",
  },
};
