"""`total = total + loss` starting from a zero tensor, kept across the whole run."""

# expect: graph_kept_alive
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    total = torch.zeros((), device=device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            total = total + loss
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x.to(device))
    return total.item()
