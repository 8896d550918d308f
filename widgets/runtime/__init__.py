"""How the served process runs its pages, not what they show: cheaper property updates
(``panel_updates``), garbage collection frozen per page (``page_gc``), and Panel in an offline
notebook (``notebook``)."""
