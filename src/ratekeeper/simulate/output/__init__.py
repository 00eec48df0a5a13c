"""What a replay found: ``report`` (as data), drawn as text (``render``) and as SVG charts
(``charts``) in one HTML page (``html``)."""
