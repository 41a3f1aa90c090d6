"""nerserve model code: text handling, architectures, training and evaluation."""
