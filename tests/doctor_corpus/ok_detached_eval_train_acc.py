"""Training accuracy taken from the training forward's own output; validation in a helper
decorated with torch.inference_mode; the model mode saved and restored."""

# expect: none
import torch


@torch.inference_mode()
def evaluate(model, loader, device):
    was_training = model.training
    model.eval()
    hits = sum((model(x.to(device)).argmax(-1) == y.to(device)).sum().item() for x, y in loader)
    model.train(was_training)
    return hits / len(loader.dataset)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device).train()
    log = []
    for _ in range(epochs):
        hits = 0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            loss = loss_fn(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            hits += (out.argmax(-1) == y).sum().item()
        log.append((hits, evaluate(model, val_loader, device)))
    return log
