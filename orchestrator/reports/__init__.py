"""Reports and notifications: a campaign's HTML and Markdown report, the issue text, the
sweep's table and plot, the environment seen, and the message sent when it ends. They read
the store and the campaign's records; nothing below imports them."""
