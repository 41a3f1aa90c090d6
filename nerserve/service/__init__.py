"""nerserve service: runs exported graphs plus numpy decoding; never imports training or export code."""
