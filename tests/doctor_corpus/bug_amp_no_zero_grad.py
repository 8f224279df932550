"""bf16 autocast on the requested device, and no zero_grad anywhere."""

# expect: missing_zero_grad
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    dev = torch.device(device)
    model.to(dev)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = loss_fn(model(x.to(dev)), y.to(dev))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(dev))
