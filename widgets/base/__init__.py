"""What every panel builds on: the session's state (``state``, read ahead by ``preload``), the
background-work mechanism (``jobs``), colours and CSS (``style``), HTML that talks to Python
(``clickable``), views that draw while shown (``lazy``), plot setup (``plots``) and picker
helpers (``pickers``)."""
