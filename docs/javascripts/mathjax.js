// MathJax 3 configuration for pymdownx.arithmatex (generic mode): typeset only the
// elements arithmatex marks, with the \( \) and \[ \] delimiters it writes.
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
};
